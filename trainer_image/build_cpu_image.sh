#!/usr/bin/env bash
# make image-cpu: the trainer image's CPU variant (trainer_image/Dockerfile with TORCH_VARIANT=cpu), built
# without a daemon or a registry: Debian bookworm from Debian's archive by mmdebstrap (its Python 3.11 matches
# the local torch and Horovod wheels), imported into buildah, and the Dockerfile built on it by buildah.
#
# usage: build_cpu_image.sh [PYTHON]
#   PYTHON  the interpreter whose pip configuration (find-links, extra index) the build hands to pip inside
#           the image, with those local directories mounted read-only (default: python3)
# Environment: PGTRAIN_IMAGE_CACHE (default ~/.cache/pgtrain: buildah's store and its storage.conf, the base's
# tarball),
# WHEEL_CACHE (default $PGTRAIN_IMAGE_CACHE/wheels: build_horovod.sh's cache, mounted so its wheel is reused).
# An image already built from the same inputs (label pgtrain.inputs) is kept. Prints the image's name last.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
cache=${PGTRAIN_IMAGE_CACHE:-$HOME/.cache/pgtrain}
wheels=${WHEEL_CACHE:-$cache/wheels}
base=localhost/pgtrain-debian:bookworm
image=localhost/pgtrain-trainer:cpu
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: make image-tools (apt-get install buildah mmdebstrap)" >&2; exit 1; }
done
mkdir -p "$cache/buildah" "$wheels"
# buildah's store for these images: use it with
#   CONTAINERS_STORAGE_CONF=~/.cache/pgtrain/buildah/storage.conf buildah from localhost/pgtrain-trainer:cpu
# overlay where this machine can mount it (a container of a 2 GB image in a second), else vfs (no mounts
# needed, but every container and every layer is a full copy: a minute each here).
export CONTAINERS_STORAGE_CONF=$cache/buildah/storage.conf
store() { printf '[storage]\ndriver = "%s"\ngraphroot = "%s"\nrunroot = "%s"\n' "$1" "$2/storage" "$2/run" \
    > "$CONTAINERS_STORAGE_CONF"; }
if [ ! -s "$CONTAINERS_STORAGE_CONF" ]; then
  probe=$cache/buildah/probe
  store overlay "$probe"
  if container=$(buildah from scratch 2>/dev/null) && buildah mount "$container" >/dev/null 2>&1; then
    driver=overlay
  else
    driver=vfs
  fi
  buildah rm --all >/dev/null 2>&1 || true
  rm -rf "$probe"
  store "$driver" "$cache/buildah/$driver"
  echo "image: buildah stores images with the $driver driver in $cache/buildah/$driver" >&2
fi

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  tarball=$cache/debian-bookworm.tar
  if [ ! -s "$tarball" ]; then
    echo "image: Debian bookworm base from Debian's archive (mmdebstrap)" >&2
    # dpkg without fsync, no documentation, apt without translations: as Debian's own container images
    mmdebstrap --quiet --variant=minbase --format=tar --dpkgopt=force-unsafe-io \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --aptopt='Acquire::Languages "none"' \
        bookworm "$tarball.part" >&2
    mv "$tarball.part" "$tarball"
  fi
  container=$(buildah from scratch)
  buildah add "$container" "$tarball" / >&2
  buildah config --cmd /bin/bash "$container"
  buildah commit --rm "$container" "$base" >&2
fi

# pip's settings on this machine (pip config list shows where they come from): the same indexes, find-links and
# CA bundle inside the build, their local paths mounted read-only at the same places. Without them pip would
# resolve torch from PyPI, whose Linux wheel is a CUDA build of several GB.
setting() { "$python" -m pip config list | sed -n "s/^[^=]*\.$1='\(.*\)'$/\1/p" | tail -n1; }
args=(--build-arg BASE_IMAGE="$base" --build-arg TORCH_VARIANT=cpu --build-arg TORCH_INDEX= --build-arg NCCL_PIN=
      --build-arg HOROVOD_WHEELS=/var/cache/pgtrain/wheels)
volumes=()
for name in index-url extra-index-url find-links cert; do
  value=$(setting "$name")
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
# What the build reads: the Dockerfile, its context (Dockerfile.dockerignore's files) and these arguments.
inputs=$( { printf '%s\n' "${args[@]}"; git ls-files -z --cached --others --exclude-standard -- \
    trainer_image/Dockerfile trainer_image/Dockerfile.dockerignore pyproject.toml constraints.txt \
    trainer_image/requirements.txt trainer_image/build_horovod.sh trainer_image/trainer plugins/pgtrain \
    ':!plugins/pgtrain/airflow' | sort -z | while IFS= read -r -d '' path; do
      if [ -L "$path" ]; then echo "$path -> $(readlink "$path")"; else sha256sum "$path"; fi
    done; } | sha256sum | cut -c1-16)
built=$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "pgtrain.inputs"}}' "$image" \
    2>/dev/null || true)
if [ "$built" = "$inputs" ]; then
  echo "image: $image is built from these inputs already" >&2
else
  echo "image: building $image with buildah" >&2
  # One working container for every step, one layer (fewer copies where the store is vfs).
  buildah bud --format docker --isolation chroot --network host --layers=false --pull=never \
      -f trainer_image/Dockerfile --ignorefile trainer_image/Dockerfile.dockerignore \
      "${args[@]}" "${volumes[@]}" --volume "$wheels:/var/cache/pgtrain/wheels" \
      --label pgtrain.inputs="$inputs" -t "$image" . >&2
  # the image this one replaced; a working container left by an interrupted build still uses it: keep it then
  buildah rmi --prune >/dev/null 2>&1 || echo "image: an older image is still in use (buildah containers lists it)" >&2
fi
echo "$image"
