"""How long a script takes to end after its last line while XLA compiles a tier-up in the
background (issue 57): each script runs in a fresh process with an empty executable
store, prints the time at its last line, and the parent takes the time its process ends.

    python benchmarks/bench_exit.py [--runs 10]

Scripts:

``bert``     three lazy BERT training steps (2 layers, hidden 256, AdamW): the graph's
             second run starts its optimized compile, the script ends during it
``loop``     a Python loop of 150 iterations at one line (the compile-time example's
             graph), run three times: a big graph whose optimized compile takes long
``none``     ``import torch, xlanb`` and one op: nothing compiles at the end (the floor)

The table gives, per script, the median and the worst seconds from the last line to the
process's end over ``--runs`` runs, the exit statuses seen, and in how many runs a tier-up
had a quick graph not yet tiered up at its last line (its tier-up queued or compiling).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_modes import _cpu_model  # noqa: E402

_END = """
m = xlanb.metrics
print(json.dumps({"last": time.time(), "tier_ups_done": m.counter_value("GraphTierUp") or 0,
                  "quick": m.counter_value("QuickCompile") or 0}), flush=True)
"""
SCRIPTS = {
    "bert": """
import json, time, torch, transformers, xlanb
torch.manual_seed(0)
cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                              intermediate_size=1024, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)
model = transformers.BertForSequenceClassification(cfg).to("xla")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, cfg.vocab_size, (8, 128)).to("xla")
labels = torch.randint(0, 2, (8,)).to("xla")
for _ in range(3):
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward(); opt.step(); opt.zero_grad()
    xlanb.sync()
""" + _END,
    "loop": """
import json, time, torch, xlanb
x = torch.ones(256, device="xla")
for _ in range(3):
    y = x
    for i in range(150): y = torch.sin(y * 1.001 + i) + torch.cos(y)
    xlanb.sync()
""" + _END,
    "none": """
import json, time, torch, xlanb
(torch.ones(4, device="xla") + 1).cpu()
""" + _END,
}


def run_once(code: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="xlanb-bench-exit-") as store:
        env = dict(os.environ, XLANB_STORE_DIR=store)
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate()
        ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"script failed ({proc.returncode}):\n{err[-3000:]}")
    info = json.loads(out.strip().splitlines()[-1])
    return {"exit_s": ended - info["last"], "status": proc.returncode,
            "compiling": info["quick"] > info["tier_ups_done"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--only", default=",".join(SCRIPTS))
    args = ap.parse_args()
    print(f"CPU: {_cpu_model()}, {os.cpu_count()} cores; {args.runs} runs each")
    print("| script | last line → end, median | worst | statuses | runs with a quick graph not yet tiered up at the last line |")
    print("|---|---|---|---|---|")
    for name in args.only.split(","):
        runs = [run_once(SCRIPTS[name]) for _ in range(args.runs)]
        times = [r["exit_s"] for r in runs]
        statuses = sorted({r["status"] for r in runs})
        print(f"| {name} | {statistics.median(times):.2f} s | {max(times):.2f} s | "
              f"{statuses} | {sum(r['compiling'] for r in runs)}/{len(runs)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
