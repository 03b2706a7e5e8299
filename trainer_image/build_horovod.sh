#!/usr/bin/env bash
# Build Horovod 0.28.1 from its sdist into a wheel, patched for C++17 (torch >= 2.1 headers need it) and gcc 13+.
# One script for both the local .venv (CPU, Gloo) and the GPU image (NCCL + MPI): the caller sets
# HOROVOD_* build flags; the defaults below are the CPU/Gloo build.
#
# usage: build_horovod.sh PYTHON WHEEL_DIR
#   PYTHON     interpreter whose torch the extension is built against (torch must be installed)
#   WHEEL_DIR  where the wheel is written; a wheel already there for the same torch and Python is reused
# Prints the wheel's path as its last line of standard output (progress goes to standard error).
set -euo pipefail
python=${1:?usage: build_horovod.sh PYTHON WHEEL_DIR}
wheel_dir=${2:?usage: build_horovod.sh PYTHON WHEEL_DIR}
version=0.28.1

torch_version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
python_tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
# A GPU build's wheel is kept apart from the CPU one of the same torch and Python (PyPI's CUDA torch has no +cuXY).
cuda=$("$python" -c 'import torch; print(torch.version.cuda or "")')
tag="torch${torch_version}-${python_tag}${HOROVOD_GPU_OPERATIONS:+-cuda${cuda}-${HOROVOD_GPU_OPERATIONS,,}}"
mkdir -p "$wheel_dir/$tag"
existing=$(ls "$wheel_dir/$tag"/horovod-"$version"-"$python_tag"-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$existing" ]; then
  echo "horovod: cached wheel $existing" >&2
  echo "$existing"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --no-deps --no-binary :all: "horovod==$version" -d "$work" >&2
tar -xzf "$work/horovod-$version.tar.gz" -C "$work"
src="$work/horovod-$version"
# torch >= 2.1 headers use C++17; Horovod 0.28.1 pins C++14 in two places.
sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" || { echo "horovod: C++17 patch did not apply" >&2; exit 1; }
# gcc 13 and newer no longer include these headers transitively (horovod PR #3957, after 0.28.1, for the first
# two; its vendored gloo uses uint*_t without <cstdint>). Harmless for older compilers: one source for every build.
sed -i 's/^#include <string>$/#include <stdexcept>\n&/' "$src/horovod/common/common.h"
sed -i 's/^#include <mutex>$/&\n#include <string>/' "$src/horovod/common/group_table.h"
grep -rlE --include='*.h' '\bu?int(8|16|32|64)_t\b' "$src/third_party/gloo/gloo" | xargs grep -L '<cstdint>' \
    | xargs -r sed -i '0,/^#pragma once$/s//#pragma once\n#include <cstdint>/'
# gcc 14 checks template bodies never instantiated: the vendored flatbuffers' span assigns its const members in a
# copy assignment nothing uses (fixed in flatbuffers 24); without it the implicit one is deleted, as it was in effect.
sed -i '/span &operator=(const span &other)$/,/^  }$/d' "$src/third_party/flatbuffers/include/flatbuffers/stl_emulation.h"
grep -q '<stdexcept>' "$src/horovod/common/common.h" && grep -q '<string>' "$src/horovod/common/group_table.h" \
    && ! grep -q 'count_ = other.count_' "$src/third_party/flatbuffers/include/flatbuffers/stl_emulation.h" \
    || { echo "horovod: gcc 13/14 patch did not apply" >&2; exit 1; }
# The CUDA runtime: Horovod links its static archive by default, a second CUDA runtime beside torch's;
# HOROVOD_CUDA_RUNTIME=Shared links the libcudart.so torch loads instead (the GPU image).
if [ -n "${HOROVOD_CUDA_RUNTIME:-}" ]; then
  sed -i "s/set(CMAKE_CUDA_RUNTIME_LIBRARY \"Static\")/set(CMAKE_CUDA_RUNTIME_LIBRARY \"$HOROVOD_CUDA_RUNTIME\")/" \
      "$src/CMakeLists.txt"
  grep -q "CMAKE_CUDA_RUNTIME_LIBRARY \"$HOROVOD_CUDA_RUNTIME\"" "$src/CMakeLists.txt" \
      || { echo "horovod: HOROVOD_CUDA_RUNTIME patch did not apply" >&2; exit 1; }
fi

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1
export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
# An MPI build needs Open MPI's headers (libopenmpi-dev), not only its compiler wrapper: Debian's openmpi-bin alone
# (mpirun for the simulated cluster's tests, `make mpi`) ships mpicxx without mpi.h.
if ! echo '#include <mpi.h>' | mpicxx -E -x c++ - >/dev/null 2>&1; then export HOROVOD_WITHOUT_MPI=1; fi
export MAKEFLAGS="-j$(nproc)"
echo "horovod: building $version against torch $torch_version (a few minutes, once)" >&2
"$python" -m pip wheel --no-build-isolation --no-deps -w "$wheel_dir/$tag" "$src" >&2
ls "$wheel_dir/$tag"/horovod-"$version"-"$python_tag"-*.whl | head -n1
