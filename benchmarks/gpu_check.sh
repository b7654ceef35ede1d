#!/usr/bin/env bash
# The checks that need NVIDIA GPUs, in one short run (at most 5 minutes), printed as one table:
# usable GPUs through NVML and probes (CUDA stays uninitialised in the caller), a busy GPU, the metric store on
# CUDA with CPU-stored keys and its cost, a training step's peak memory against its prediction, and with 2 GPUs a
# launch whose metrics reduce over NCCL.
# Without a GPU it says so and exits 0; a broken setup (no .venv, trainplan or torch missing) exits 2.
# Run from anywhere: benchmarks/gpu_check.sh   (PYTHON=... to use another interpreter than .venv's)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
if [ ! -x "$PYTHON" ] && ! command -v "$PYTHON" > /dev/null 2>&1; then
    echo "cannot run the GPU checks: no interpreter at $PYTHON. Run \`make test\` first (it creates .venv), or set PYTHON" >&2
    exit 2
fi
exec timeout 300 "$PYTHON" -m benchmarks.gpu_check "$@"
