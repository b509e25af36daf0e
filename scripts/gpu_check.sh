#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: run the tests marked `cuda`, the GPU benchmark and the
# compiled tier on CUDA (compiled vs eager CUDA vs the interpreter with CUDA graphs), and
# write everything under $OUT (default ./gpu-results). Uses the machine's own PyTorch and
# pytest (ptexec from this checkout via PYTHONPATH); installs nothing that needs a network.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
"$PY" - <<'PY' 2>&1 | tee "$OUT/env.txt"
import torch, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", "devices", torch.cuda.device_count())
PY
"$PY" -m pytest -q -m cuda -p no:cacheprovider tests 2>&1 | tee "$OUT/cuda-tests.txt"
tests_rc=${PIPESTATUS[0]}
"$PY" benchmarks/gpu_bench.py --json "$OUT/gpu-bench.json" ${PTEXEC_GPU_MODELS:+--extra "$PTEXEC_GPU_MODELS"} 2>&1 | tee "$OUT/gpu-bench.txt"
bench_rc=${PIPESTATUS[0]}
# the compiled tier: a cache of its own, so every figure includes a first compile
PTEXEC_CACHE_DIR="$OUT/compile-cache" "$PY" benchmarks/gpu_compiled.py --json "$OUT/gpu-compiled.json" 2>&1 | tee "$OUT/gpu-compiled.txt"
compiled_rc=${PIPESTATUS[0]}
echo "cuda tests rc=$tests_rc, benchmark rc=$bench_rc, compiled rc=$compiled_rc" | tee "$OUT/summary.txt"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$compiled_rc" -eq 0 ]
