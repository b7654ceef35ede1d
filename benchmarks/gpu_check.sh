#!/usr/bin/env bash
# The checks that need NVIDIA GPUs, in one short run (at most 5 minutes), printed as one table:
# usable GPUs through NVML and probes (CUDA stays uninitialised in the caller), a busy GPU, the metric store on
# CUDA with CPU-stored keys and its cost, and with 2 GPUs a launch whose metrics reduce over NCCL.
# Without a GPU it says so and exits 0. Run from anywhere: benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
if [ ! -x "$PYTHON" ]; then
    PYTHON=python3
fi
exec timeout 300 "$PYTHON" -m benchmarks.gpu_check "$@"
