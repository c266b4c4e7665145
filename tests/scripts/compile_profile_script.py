"""Compile profiles in a fresh process (tests/test_compile_profile.py): JAX's profiler
cannot start in a process where libtpu's plugin was loaded for a target (another test
file may have done so in the test process), so the CPU's phase spans are measured here,
and the TPU target's last. Prints one JSON object."""
import json
import sys

import torch

import xlanb


class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 32)
        self.fc2 = torch.nn.Linear(32, 32)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        # one line on purpose: 60 unrolled iterations, every op at this line
        for i in range(60): x = torch.relu(x * 1.01 + i)
        return self.fc2(x)


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def two_lines(x):
    a = torch.sin(x * 2 + 1)
    return (a * a).sum(dim=1)


def profile_dict(p) -> dict:
    return {"total": p.total_s, "parts": [list(part) for part in p.parts],
            "unattributed": p.unattributed_s, "phases": p.phases(), "notes": list(p.notes),
            "lines": [list(r) for r in p.by_line(None)],
            "scopes": [list(r) for r in p.by_scope(None)], "method": p.method,
            "text": str(p), "html": p._repr_html_()}


def main() -> None:
    with open(__file__) as f:
        source = f.read().splitlines()
    # the loop unrolled at one line, and the two lines of two_lines
    out = {"loop_line": next(i for i, t in enumerate(source, 1) if "for i in range(60)" in t),
           "two_lines": [two_lines.__code__.co_firstlineno + 1,
                         two_lines.__code__.co_firstlineno + 2]}
    torch.manual_seed(0)
    with torch.no_grad():
        m = Slow().to("xla")
        x = torch.randn(8, 32).to("xla")
        y = m(x).sum()
        xlanb.sync()
        g = xlanb.graphs()[-1]
        out["slow"] = profile_dict(g.compile_profile) | {"compile_time": g.compile_time,
                                                         "table": str(xlanb.graphs())}
        s = Stack().to("xla")
        z = s(torch.randn(4, 16).to("xla"))
        xlanb.sync()
        out["stack"] = profile_dict(xlanb.graphs()[-1].compile_profile)
        w = two_lines(torch.randn(8, 8).to("xla"))
        xlanb.sync()
        out["two"] = profile_dict(xlanb.graphs()[-1].compile_profile)
        xlanb.config.compile_profile = False
        u = torch.cos(w) + 3
        xlanb.sync()
        out["off"] = profile_dict(xlanb.graphs()[-1].compile_profile)
        xlanb.config.compile_profile = True
        if "--tpu" in sys.argv:
            r = xlanb.compile_for("v5e:1x1", y * 2)
            # the same graph again, twice, each profile read after all three compiles:
            # libtpu's log reaches its file late, so each compile's window of the file
            # began on the first compile's lines (issue 48: parts that double-counted)
            again = [xlanb.compile_for("v5e:1x1", y * 2) for _ in range(2)]
            out["tpu"] = profile_dict(r.compile_profile) | {"error": r.error}
            out["tpu_again"] = [profile_dict(a.compile_profile) | {"error": a.error}
                                for a in again]
    del z, u
    print("JSON" + json.dumps(out))


if __name__ == "__main__":
    main()
