#!/usr/bin/env bash
# make image-gpu: the trainer image's GPU variant (trainer_image/Dockerfile.gpu), built without a daemon, a
# registry or a GPU: Debian trixie from Debian's archive by mmdebstrap, the Dockerfile built on it by buildah,
# torch's CUDA wheels and Horovod's sources from PyPI.
#
# usage: build_gpu_image.sh [TORCH_VARIANT [TORCH_INDEX]]
# (python3's pip configuration gives the build its CA bundle only, mounted read-only: a proxy's CA.)
#   TORCH_VARIANT  the torch build (trainer_image/torch_builds.toml; default cu130, PyPI's own wheel)
#   TORCH_INDEX    where that build comes from (default: PyPI); cu126 for drivers older than R580:
#                  build_gpu_image.sh cu126 https://download.pytorch.org/whl/cu126
# Environment: PGTRAIN_IMAGE_CACHE (default ~/.cache/pgtrain: buildah's store, the base's tarball, pip's cache of
# the CUDA wheels), WHEEL_CACHE (default $PGTRAIN_IMAGE_CACHE/wheels: build_horovod.sh's cache, mounted so its
# Horovod wheel is reused). An image already built from the same inputs (label pgtrain.inputs) is kept. Prints
# the image's name last.
set -euo pipefail
cd "$(dirname "$0")/.."
source trainer_image/buildah_image.sh
variant=${1:-cu130}
index=${2:-}
wheels=${WHEEL_CACHE:-$image_cache/wheels}
image=localhost/pgtrain-trainer:gpu
[ "$variant" = cu130 ] || image=$image-$variant
image_tools
image_store
mkdir -p "$wheels" "$image_cache/pip"
base=$(debian_base trixie)
# pip inside the build uses its default index (PyPI), not this machine's pip configuration: a local index of
# CPU wheels must not satisfy the pin with a CPU torch.
args=(--build-arg BASE_IMAGE="$base" --build-arg TORCH_VARIANT="$variant" --build-arg TORCH_INDEX="$index"
      --build-arg HOROVOD_WHEELS=/var/cache/pgtrain/wheels)
volumes=()
cert=$(pip_setting python3 cert)
if [ -n "$cert" ]; then
  args+=(--build-arg PIP_CERT=/run/pgtrain-pip-cert.pem)
  volumes+=(--volume "$cert:/run/pgtrain-pip-cert.pem:ro")
fi
build_image "$image" trainer_image/Dockerfile.gpu "$(image_inputs trainer_image/Dockerfile.gpu "${args[@]}")" \
    "${args[@]}" "${volumes[@]}" --volume "$wheels:/var/cache/pgtrain/wheels" \
    --volume "$image_cache/pip:/root/.cache/pip"
echo "$image"
