# Sourced by build_cpu_image.sh and build_gpu_image.sh: the trainer image built without a daemon or a registry,
# on a Debian base made by mmdebstrap from Debian's archive, with buildah.
#
# Environment: PGTRAIN_IMAGE_CACHE (default ~/.cache/pgtrain: buildah's store and its storage.conf, the bases'
# tarballs). Use the store with
#   CONTAINERS_STORAGE_CONF=~/.cache/pgtrain/buildah/storage.conf buildah from localhost/pgtrain-trainer:cpu

image_cache=${PGTRAIN_IMAGE_CACHE:-$HOME/.cache/pgtrain}

image_tools() {
  local tool
  for tool in buildah mmdebstrap; do
    command -v "$tool" >/dev/null || {
      echo "$tool is missing: make image-tools (apt-get install buildah mmdebstrap)" >&2; exit 1; }
  done
}

# buildah's store: overlay where this machine can mount it (a container of a 2 GB image in a second), else vfs
# (no mounts needed, but every container and every layer is a full copy: a minute each here).
image_store() {
  mkdir -p "$image_cache/buildah"
  export CONTAINERS_STORAGE_CONF=$image_cache/buildah/storage.conf
  [ -s "$CONTAINERS_STORAGE_CONF" ] && return
  local probe=$image_cache/buildah/probe driver container
  _storage_conf overlay "$probe"
  if container=$(buildah from scratch 2>/dev/null) && buildah mount "$container" >/dev/null 2>&1; then
    driver=overlay
  else
    driver=vfs
  fi
  buildah rm --all >/dev/null 2>&1 || true
  rm -rf "$probe"
  _storage_conf "$driver" "$image_cache/buildah/$driver"
  echo "image: buildah stores images with the $driver driver in $image_cache/buildah/$driver" >&2
}

_storage_conf() {
  printf '[storage]\ndriver = "%s"\ngraphroot = "%s"\nrunroot = "%s"\n' "$1" "$2/storage" "$2/run" \
      > "$CONTAINERS_STORAGE_CONF"
}

# debian_base SUITE: localhost/pgtrain-debian:SUITE, minbase from Debian's archive, made once.
debian_base() {
  local suite=$1 base=localhost/pgtrain-debian:$1 tarball=$image_cache/debian-$1.tar container
  if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
    if [ ! -s "$tarball" ]; then
      echo "image: Debian $suite base from Debian's archive (mmdebstrap)" >&2
      # dpkg without fsync, no documentation, apt without translations: as Debian's own container images
      nice -n 10 mmdebstrap --quiet --variant=minbase --format=tar --dpkgopt=force-unsafe-io \
          --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
          --dpkgopt='path-exclude=/usr/share/locale/*' --aptopt='Acquire::Languages "none"' \
          "$suite" "$tarball.part" >&2
      mv "$tarball.part" "$tarball"
    fi
    container=$(buildah from scratch)
    buildah add "$container" "$tarball" / >&2
    buildah config --cmd /bin/bash "$container"
    buildah commit --rm "$container" "$base" >&2
  fi
  echo "$base"
}

# pip_setting PYTHON NAME: that setting of pip's configuration on this machine (pip config list says where from).
pip_setting() { "$1" -m pip config list | sed -n "s/^[^=]*\.$2='\(.*\)'$/\1/p" | tail -n1; }

# image_inputs DOCKERFILE ARG...: a digest of what a build reads, the Dockerfile, the build arguments and the
# repository files the Dockerfiles copy; an image labelled pgtrain.inputs with it is not built again.
image_inputs() {
  { printf '%s\n' "$@"; git ls-files -z --cached --others --exclude-standard -- "$1" \
      trainer_image/Dockerfile.dockerignore trainer_image/setup_ssh.sh trainer_image/torch_builds.toml \
      trainer_image/check_gpu_image.py \
      pyproject.toml constraints.txt trainer_image/requirements.txt trainer_image/build_horovod.sh \
      trainer_image/trainer plugins/pgtrain ':!plugins/pgtrain/airflow' | sort -z | while IFS= read -r -d '' path; do
        if [ -L "$path" ]; then echo "$path -> $(readlink "$path")"; else sha256sum "$path"; fi
      done; } | sha256sum | cut -c1-16
}

# build_image IMAGE DOCKERFILE INPUTS BUD_ARG...: buildah bud unless IMAGE was built from INPUTS already.
build_image() {
  local image=$1 dockerfile=$2 inputs=$3 built
  shift 3
  built=$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "pgtrain.inputs"}}' "$image" \
      2>/dev/null || true)
  if [ "$built" = "$inputs" ]; then
    echo "image: $image is built from these inputs already" >&2
    return
  fi
  echo "image: building $image with buildah" >&2
  # One working container for every step of a stage, one layer (fewer copies where the store is vfs).
  nice -n 10 buildah bud --format docker --isolation chroot --network host --layers=false --pull=never \
      -f "$dockerfile" --ignorefile trainer_image/Dockerfile.dockerignore \
      "$@" --label pgtrain.inputs="$inputs" -t "$image" . >&2
  # the image this one replaced; a working container left by an interrupted build still uses it: keep it then
  buildah rmi --prune >/dev/null 2>&1 \
      || echo "image: an older image is still in use (buildah containers lists it)" >&2
}
