#!/usr/bin/env bash
# make image-cpu: the trainer image's CPU variant (trainer_image/Dockerfile with TORCH_VARIANT=cpu), built
# without a daemon or a registry: Debian bookworm from Debian's archive by mmdebstrap (its Python 3.11 matches
# the local torch and Horovod wheels), imported into buildah, and the Dockerfile built on it by buildah.
#
# usage: build_cpu_image.sh [PYTHON]
#   PYTHON  the interpreter whose pip configuration (find-links, extra index) the build hands to pip inside
#           the image, with those local directories mounted read-only (default: python3)
# Environment: PGTRAIN_IMAGE_CACHE (trainer_image/buildah_image.sh, shared with build_gpu_image.sh),
# WHEEL_CACHE (default $PGTRAIN_IMAGE_CACHE/wheels: build_horovod.sh's cache, mounted so its wheel is reused).
# An image already built from the same inputs (label pgtrain.inputs) is kept. Prints the image's name last.
set -euo pipefail
cd "$(dirname "$0")/.."
source trainer_image/buildah_image.sh
python=${1:-python3}
wheels=${WHEEL_CACHE:-$image_cache/wheels}
image=localhost/pgtrain-trainer:cpu
image_tools
image_store
mkdir -p "$wheels"
base=$(debian_base bookworm)

# pip's settings on this machine (pip config list shows where they come from): the same indexes, find-links and
# CA bundle inside the build, their local paths mounted read-only at the same places. Without them pip would
# resolve torch from PyPI, whose Linux wheel is a CUDA build of several GB.
args=(--build-arg BASE_IMAGE="$base" --build-arg TORCH_VARIANT=cpu --build-arg TORCH_INDEX= --build-arg NCCL_PIN=
      --build-arg HOROVOD_WHEELS=/var/cache/pgtrain/wheels)
volumes=()
for name in index-url extra-index-url find-links cert; do
  value=$(pip_setting "$python" "$name")
  [ -n "$value" ] || continue
  # A build argument is in the image's history for anyone who pulls it: no index password may become one.
  if printf '%s' "$value" | grep -Eq '://[^/@ ]+:[^/@ ]*@'; then
    echo "build_cpu_image.sh: pip's $name holds a URL with a user and password; a build argument would keep it" \
         "in the image's history. Use a keyring, a netrc on a --volume, or an index without credentials" >&2
    exit 2
  fi
  if [ "$name" = cert ]; then  # beside the image's own CA bundle, which its ca-certificates package writes
    volumes+=(--volume "$value:/run/pgtrain-pip-cert.pem:ro")
    value=/run/pgtrain-pip-cert.pem
  fi
  args+=(--build-arg "PIP_$(echo "$name" | tr 'a-z-' 'A-Z_')=$value")
  for location in $value; do
    path=${location#file://}
    # a local index's pages link to its files beside them (simple/NAME/ -> ../../files/): mount its root
    case $name in index-url | extra-index-url) path=$(dirname "$path") ;; esac
    if [ "$name" != cert ] && [ "${path:0:1}" = / ] && [ -e "$path" ]; then
      volumes+=(--volume "$path:$path:ro")
    fi
  done
done
build_image "$image" trainer_image/Dockerfile "$(image_inputs trainer_image/Dockerfile "${args[@]}")" \
    "${args[@]}" "${volumes[@]}" --volume "$wheels:/var/cache/pgtrain/wheels"
echo "$image"
