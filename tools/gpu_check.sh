#!/usr/bin/env bash
# What to run on a machine with an NVIDIA GPU and JAX's CUDA build (issue 43), in one go:
#
#     OUT=/some/dir bash tools/gpu_check.sh [pytest -m expression]
#
# It keeps the machine's own torch and jax (xlanb is installed with --no-deps, nothing
# else is installed), checks that JAX sees the GPU, then with XLANB_PLATFORM=gpu runs
#   1. a smoke check: a small model's training step in lazy, eager and opbyop against CPU
#      torch, and that the tensors really lie on a GPU device;
#   2. examples/demo.py;
#   3. a test tier: -m "not slow" by default (the fast tier); pass "versions and not slow"
#      for the few-minute torch-facing tier.
# Results go under $OUT (default ./gpu-check-out): versions.txt, smoke.json, demo.log,
# tests.log, tests.xml and summary.txt. The first failing step ends the script with its
# reason in summary.txt and a non-zero status. pytest must already be installed there.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
TIER=${1:-not slow}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
say() { echo "gpu_check: $*" | tee -a "$OUT/summary.txt"; }
fail() { say "FAIL: $*"; exit 1; }
export XLANB_PLATFORM=gpu PYTHONWARNINGS=ignore

python - > "$OUT/versions.txt" 2> "$OUT/versions.err" <<'EOF' || fail "JAX sees no GPU here: $(tail -1 "$OUT/versions.err")"
import jax, jaxlib, torch
print("torch", torch.__version__, "jax", jax.__version__, "jaxlib", jaxlib.__version__)
gpus = jax.devices("gpu")  # raises where JAX has no CUDA backend
print("gpus", [f"{d.device_kind} ({d.platform}:{d.id})" for d in gpus])
EOF
say "$(tr '\n' ' ' < "$OUT/versions.txt")"
python -c "import pytest" 2>/dev/null || fail "pytest is not installed (pip install pytest pytest-timeout)"

# xlanb without touching torch or jax: no dependencies; no build isolation first (no
# downloads: the machine may be offline), else pip's own isolated build
{ pip install -q --no-deps --no-build-isolation -e . || pip install -q --no-deps -e . ; } \
  > "$OUT/install.log" 2>&1 || fail "pip install --no-deps -e . failed: $(tail -1 "$OUT/install.log")"
python -c "import xlanb" > "$OUT/import.log" 2>&1 || fail "import xlanb: $(tail -1 "$OUT/import.log")"
say "xlanb installed (no deps)"

python - > "$OUT/smoke.json" 2> "$OUT/smoke.err" <<'EOF' || fail "smoke check: $(tail -1 "$OUT/smoke.err")"
import json, time
import torch, xlanb
from xlanb.runtime.devices import platform_name

def step(device, mode=None):
    if mode:
        xlanb.set_mode(mode)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32).to(device), torch.randint(0, 10, (16,)).to(device)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if mode:
            xlanb.sync()
        losses.append(loss.item())
    return losses, model[0].weight.detach().cpu()

assert platform_name() == "gpu", platform_name()
xlanb.config.mat_mul_precision = "highest"  # no TF32: compare with CPU torch's float32
ref, w_ref = step("cpu")
out = {"platform": platform_name(), "cpu": ref}
for mode in xlanb.MODES:
    t0 = time.perf_counter()
    got, w = step("xla", mode)
    out[mode] = {"losses": got, "seconds": round(time.perf_counter() - t0, 3),
                 "max_weight_diff": float((w - w_ref).abs().max())}
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w, w_ref, atol=1e-4, rtol=1e-4)
print(json.dumps(out))
EOF
say "smoke: three modes match CPU torch on $(python -c "import json; print(json.load(open('$OUT/smoke.json'))['platform'])")"

python examples/demo.py > "$OUT/demo.log" 2>&1 || fail "examples/demo.py: $(tail -1 "$OUT/demo.log")"
say "demo ran"

python -m pytest -q -m "$TIER" -p no:cacheprovider --junitxml="$OUT/tests.xml" \
  > "$OUT/tests.log" 2>&1
rc=$?
say "tests (-m \"$TIER\"): $(tail -1 "$OUT/tests.log")"
[ $rc -eq 0 ] || fail "tests failed (rc $rc): see tests.log"
say "all passed"
