#!/usr/bin/env bash
# The first GPU run, on one GPU machine (inside the GPU image, `make image-gpu`, or any CUDA environment with
# pgtrain's requirements and both backends): check the GPU stack (CUDA, driver, NCCL, TF32, bf16), then run
# benchmarks/bench_gpu.py, whose figures benchmarks/run_all.py merges into benchmarks/results.json. Sized for under
# 8 minutes on one GPU (GPU_CHECK_SECONDS bounds the whole); fails (exit 2) naming what is missing without CUDA.
#
#   scripts/gpu_check.sh                 # PYTHON=... to use another interpreter than .venv/bin/python or python
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
export PYTHONPATH="$PWD/plugins:$PWD/trainer_image:$PWD${PYTHONPATH:+:$PYTHONPATH}"
budget=${GPU_CHECK_SECONDS:-480}
started=$SECONDS

echo "== GPU checks"
if ! timeout 120 "$PYTHON" benchmarks/bench_gpu.py --check; then
    echo "gpu_check: the GPU checks failed (above); nothing was measured" >&2
    exit 2
fi

echo "== bench_gpu (figures -> benchmarks/results.json)"
left=$((budget - (SECONDS - started)))
if ! timeout "$left" "$PYTHON" benchmarks/run_all.py gpu; then
    echo "gpu_check: the benchmark failed or ran past ${budget}s (GPU_CHECK_SECONDS)" >&2
    exit 1
fi
echo "gpu_check: done in $((SECONDS - started))s"
