"""``model.generate()`` on xla, side by side with CPU torch and torch_xla, in one run (issue 56).

    python benchmarks/bench_generate.py [--tokens N] [--torch-xla /venv/bin/python]
                                        [--only llama,gpt2] [--out FILE] [--json FILE]
                                        [--skip MODEL/CACHE/BACKEND,...] [--think S] [--repeat N]
                                        [--processes K]

Each row runs in a fresh process with an empty executable store: a small Llama and a
small GPT-2 from ``transformers`` configs (random weights, no downloads), greedy
``generate(max_new_tokens=N)`` with an end-of-sequence token none of the outputs holds
(so every token is generated and checked for, as with a real tokenizer's), called three
times: a prompt of 7 tokens, one of 11 (a new prompt length), and another of 11 (every
shape seen before: the cached cost, the median of ``--repeat`` calls, 5 by default: one
call of a fraction of a second moved by ±50% on a loaded VM). Caches: the default dynamic
one, and ``cache_implementation="static"``. Backends: CPU torch, CPU torch through a
tensor subclass whose ``__torch_dispatch__`` does nothing (the floor of any backend
written in Python: torch's dispatch to Python alone), xlanb lazy and eager,
torch_xla 2.x lazy and eager (only with ``--torch-xla``, a Python with torch_xla
installed; keep it out of CI, it is a download of several GB). Each call reports its
time, graphs compiled and graphs run (syncs) per token, and whether its tokens equal CPU
torch's (computed in the same process, before the model moves to the device).
``--processes K`` runs each row in K fresh processes and reports each call's median over
them: on a loaded VM one process's figures differed from the next one's by ±25%.
``--think S`` waits S seconds between calls, untimed, as a notebook user reads each output;
xlanb's rows then call ``xlanb.optimize_hot_graphs()``, as its IPython extension does when a
cell ends.

Writes docs/benchmarks.md's "generate" section unless ``--out`` names another file.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
from bench_modes import _cpu_model  # noqa: E402

MODELS = ("llama", "gpt2")
CACHES = ("dynamic", "static")
# a prompt, one of a new length, then another of that length (shapes seen: cached cost)
PROMPTS = (7, 11, 11)


def _model(name: str):
    import torch
    import transformers
    torch.manual_seed(0)
    if name == "llama":
        cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=256)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(vocab_size=256, n_embd=128, n_layer=2, n_head=4,
                                      n_positions=256, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    return model.eval()


def _null_subclass():
    """A tensor subclass whose ``__torch_dispatch__`` does nothing but unwrap, call CPU
    torch and wrap: what torch's dispatch to Python costs any backend written in Python,
    before it does any work of its own (the floor under xlanb's times)."""
    import torch

    class Null(torch.Tensor):
        @staticmethod
        def __new__(cls, elem):
            r = torch.Tensor._make_wrapper_subclass(
                cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
                dtype=elem.dtype, device=elem.device, requires_grad=False)
            r.elem = elem
            return r

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            def un(x):
                if type(x) is Null:
                    return x.elem
                if type(x) in (list, tuple):
                    return type(x)(un(y) for y in x)
                return x
            out = func(*un(args), **({k: un(v) for k, v in kwargs.items()} if kwargs else {}))
            if type(out) is torch.Tensor:
                return Null(out)
            if type(out) in (list, tuple):
                return type(out)(Null(x) if type(x) is torch.Tensor else x for x in out)
            return out

    def wrap_model(model):
        for m in model.modules():
            for k, v in list(m._parameters.items()):
                if v is not None:
                    m._parameters[k] = torch.nn.Parameter(Null(v.data), requires_grad=False)
            for k, v in list(m._buffers.items()):
                if v is not None:
                    m._buffers[k] = Null(v)
        return model

    return Null, wrap_model


def _worker(backend: str, mode: str, model_name: str, cache: str, tokens: int) -> dict:
    import torch
    model = _model(model_name)
    kw = dict(max_new_tokens=tokens, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    torch.manual_seed(1)
    prompts = [torch.randint(1, 256, (1, n)) for n in PROMPTS]
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        first = [model.generate(p, **kw) for p in prompts]
    used = set(torch.cat([w.flatten() for w in first]).tolist())
    model.generation_config.eos_token_id = next(i for i in range(255, 0, -1) if i not in used)
    with torch.no_grad():
        want = [model.generate(p, **kw) for p in prompts]
    counts = lambda: (0, 0)  # noqa: E731
    if backend in ("cpu", "null"):
        dev = torch.device("cpu")
    elif backend == "torch_xla":
        import torch_xla
        import torch_xla.debug.metrics as met
        if mode == "eager":
            torch_xla.experimental.eager_mode(True)
        dev = torch_xla.device()

        def counts():
            return (met.counter_value("UncachedCompile") or 0,
                    met.counter_value("ExecuteComputation") or 0)
    else:
        import xlanb
        xlanb.set_mode(mode)
        dev = xlanb.device()
        c = xlanb.metrics.counter_value

        def counts():
            graphs = sum(c(k) or 0 for k in ("UncachedCompile", "EagerRunCompile", "OpCompile"))
            # a segmented graph runs as several: count the graph once, as a sync
            runs = sum(c(k) or 0 for k in ("UncachedCompile", "CachedCompile", "EagerRunCompile",
                                           "EagerRunCacheHit"))
            runs -= (c("SegmentCompile") or 0) + (c("SegmentCacheHit") or 0) \
                - (c("SegmentedGraph") or 0)
            return graphs, runs
    model = model.to(dev)
    put = lambda p: p.to(dev)  # noqa: E731
    if backend == "null":
        null, wrap_model = _null_subclass()
        model, put = wrap_model(model), null
    calls = []
    think = float(os.environ.get("BENCH_THINK_S", "0"))
    repeat = int(os.environ.get("BENCH_REPEAT", "1"))
    order = list(enumerate(zip(prompts, want)))
    order += [order[-1]] * (repeat - 1)  # the cached call again: its median is reported
    for i, (p, w) in order:
        if think and i:  # a notebook user reads the output; xlanb's extension, at the
            if backend == "xlanb":  # cell's end, starts the hot runs' tier-ups
                import xlanb
                xlanb.optimize_hot_graphs()
            time.sleep(think)
        c0, r0 = counts()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(put(p), **kw)
        got = out.elem if backend == "null" else out.cpu()
        dt = time.perf_counter() - t0
        c1, r1 = counts()
        calls.append({"s": dt, "ok": bool(torch.equal(got, w)),
                      "compiles_per_token": (c1 - c0) / tokens,
                      "runs_per_token": (r1 - r0) / tokens})
    cached = calls[len(prompts) - 1:]
    if len(cached) > 1:
        times = [c["s"] for c in cached]
        median = dict(cached[0], s=_median(times), ok=all(c["ok"] for c in cached),
                      compiles_per_token=max(c["compiles_per_token"] for c in cached),
                      spread=(min(times), max(times)))
        calls = calls[:len(prompts) - 1] + [median]
    return {"calls": calls, "torch": torch.__version__}


def run_rows(python: str, backend: str, mode: str, model: str, cache: str, tokens: int,
             env: dict | None, think: float, repeat: int, processes: int) -> dict:
    """``run_row`` in ``processes`` fresh processes: each call's median over them (a
    process's figures moved by ±25% from one to the next on a loaded VM), the cached
    call's range over every process's calls."""
    rows = [run_row(python, backend, mode, model, cache, tokens, env, think, repeat)
            for _ in range(processes)]
    failed = [r for r in rows if "error" in r]
    if failed or len(rows) == 1:
        return (failed or rows)[0]
    calls = []
    for i, first in enumerate(rows[0]["calls"]):
        got = [r["calls"][i] for r in rows]
        call = dict(first, s=_median([c["s"] for c in got]), ok=all(c["ok"] for c in got))
        if "spread" in first:
            call["spread"] = (min(c["spread"][0] for c in got), max(c["spread"][1] for c in got))
        calls.append(call)
    return {"calls": calls, "torch": rows[0]["torch"], "processes": len(rows),
            "per_process": [[c["s"] for c in r["calls"]] for r in rows]}


def _median(times: list) -> float:
    """The middle time (of an even count, the upper of the two middle ones)."""
    return sorted(times)[len(times) // 2]


def run_row(python: str, backend: str, mode: str, model: str, cache: str, tokens: int,
            env: dict | None = None, think: float = 0.0, repeat: int = 1) -> dict:
    store = tempfile.mkdtemp(prefix="xlanb-bench-gen-")
    full_env = dict(os.environ, PJRT_DEVICE="CPU", XLANB_STORE_DIR=store,
                    BENCH_THINK_S=str(think), BENCH_REPEAT=str(repeat), **(env or {}))
    out = subprocess.run([python, HERE, "--worker", backend, mode, model, cache, str(tokens)],
                         capture_output=True, text=True, env=full_env, check=False)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def rows_for(args) -> list[tuple]:
    rows = [("CPU torch", sys.executable, "cpu", "-", None),
            ("null subclass (floor)", sys.executable, "null", "-", None),
            ("xlanb eager", sys.executable, "xlanb", "eager", None),
            ("xlanb lazy", sys.executable, "xlanb", "lazy", None)]
    if args.torch_xla:
        rows += [("torch_xla eager", args.torch_xla, "torch_xla", "eager", None),
                 ("torch_xla lazy", args.torch_xla, "torch_xla", "lazy", None)]
    if args.whole:  # what this issue replaced: each new shape compiles the whole graph
        rows += [("xlanb eager, segments off", sys.executable, "xlanb", "eager",
                  {"XLANB_SEGMENTS": "0", "XLANB_HOST_SEGMENT_BYTES": "0"}),
                 ("xlanb lazy, segments off", sys.executable, "xlanb", "lazy",
                  {"XLANB_SEGMENTS": "0", "XLANB_HOST_SEGMENT_BYTES": "0"}),
                 ("xlanb lazy, no host segments", sys.executable, "xlanb", "lazy",
                  {"XLANB_HOST_SEGMENT_BYTES": "0"}),
                 ("xlanb eager, no host segments", sys.executable, "xlanb", "eager",
                  {"XLANB_HOST_SEGMENT_BYTES": "0"})]
    return rows


def _cell(call: dict) -> str:
    ok = "" if call["ok"] else " **WRONG**"
    spread = f" [{call['spread'][0]:.2f}-{call['spread'][1]:.2f}]" if "spread" in call else ""
    return (f"{call['s']:.2f} s{spread} ({call['compiles_per_token']:.1f} / "
            f"{call['runs_per_token']:.1f}){ok}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--torch-xla", default=None, help="a Python with torch_xla 2.x installed")
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--caches", default=",".join(CACHES))
    ap.add_argument("--whole", action="store_true",
                    help="also xlanb with segments and host segments off")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                  "docs", "benchmarks.md"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--think", type=float, default=0.0,
                    help="seconds between calls, as a notebook user reads each output "
                         "(xlanb rows call xlanb.optimize_hot_graphs() then, as its "
                         "IPython extension does when a cell ends); not timed")
    ap.add_argument("--repeat", type=int, default=5,
                    help="calls of the last prompt (every shape seen): the cached cost is "
                         "their median, with their range in brackets")
    ap.add_argument("--processes", type=int, default=1,
                    help="fresh processes per row (torch_xla lazy's: one, it takes minutes); "
                         "each call's median over them")
    ap.add_argument("--skip", default="",
                    help="cells to leave out, comma-separated MODEL/CACHE/BACKEND, e.g. "
                         "'gpt2/static/torch_xla lazy' (torch_xla's lazy rows take minutes)")
    args = ap.parse_args()
    results = {}
    lines = []
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    for model in args.only.split(","):
        for cache in args.caches.split(","):
            lines += [f"\n**{model}, {cache} cache**, {args.tokens} tokens per call: time "
                      "(graphs compiled / graphs run, per token)\n",
                      "| backend | 1st call (prompt 7) | 2nd call (prompt 11) "
                      f"| 3rd call (another prompt of 11{', median of %d' % args.repeat if args.repeat > 1 else ''}) |",
                      "|---|---|---|---|"]
            for name, python, backend, mode, env in rows_for(args):
                if f"{model}/{cache}/{name}" in skip:
                    continue
                n = 1 if backend == "torch_xla" and mode == "lazy" else args.processes
                r = run_rows(python, backend, mode, model, cache, args.tokens, env, args.think,
                             args.repeat, n)
                results[f"{model}/{cache}/{name}"] = r
                if "error" in r:
                    lines.append(f"| {name} | failed: {r['error'][:80]} | |")
                else:
                    lines.append(f"| {name} | " + " | ".join(_cell(c) for c in r["calls"]) + " |")
                print(lines[-1], flush=True)
    import jax
    import torch
    head = (f"Measured {datetime.date.today()} on {platform.machine()} ({_cpu_model()}), "
            f"{os.cpu_count()} cores, Python {platform.python_version()}, torch "
            f"{torch.__version__}, jax {jax.__version__}"
            + (f", torch_xla under torch {next((r['torch'] for k, r in results.items() if 'torch_xla' in k and 'torch' in r), '?')}"
               if args.torch_xla else "")
            + (". One fresh process per cell" if args.processes == 1 else
               f". {args.processes} fresh processes per cell (torch_xla lazy: one), each "
               "call's median over them, the cached call's range over all")
            + ", empty executable store"
            + (f"; {args.think:g} s between calls (not timed)" if args.think else "") + ".")
    section = "## generate() (benchmarks/bench_generate.py)\n\n" + head + "\n" + "\n".join(lines) + "\n"
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    _write_section(args.out, section)
    print(section)


def _write_section(path: str, section: str) -> None:
    """Replace (or append) the generate section of ``path``."""
    text = open(path).read() if os.path.exists(path) else ""
    start = text.find("## generate() (benchmarks/bench_generate.py)")
    if start >= 0:
        end = text.find("\n## ", start + 3)
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        b, m, model, cache, n = sys.argv[2:7]
        print(json.dumps(_worker(b, m, model, cache, int(n))))
    else:
        main()
