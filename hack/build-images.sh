#!/usr/bin/env bash
# build-images.sh: OCI image archives of the manager and the agent (with libgpushare.so), made without a
# container engine from the binaries `make build` produced, plus the two images the real-node e2e needs
# besides them: the pod sandbox ("pause"), a busybox for test pods and a shim workload over a stub driver. Bases are unpacked from Debian's
# packages (hack/debian-rootfs.sh): glibc for the cgo binaries, and busybox-static where a shell is wanted
# (the agent's simulated driver tools, test pods). The files the Dockerfile copies land at the same paths
# (test/images checks both against each other). Each archive NAME.tar gets its SPDX SBOM NAME.spdx.json
# beside it (hack/sbom): the pinned Debian packages of its base, the files added, the Go modules in them.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BIN:-$ROOT/bin}"
OUT="${IMAGES_DIR:-$BIN/images}"
TAG="${IMAGE_TAG:-e2e}"
mkdir -p "$OUT"
cd "$ROOT"

for b in manager agent; do [[ -x "$BIN/$b" ]] || { echo "$BIN/$b missing: run make build first" >&2; exit 1; }; done
[[ -f shim/build/libgpushare.so ]] || { echo "shim/build/libgpushare.so missing: run make build first" >&2; exit 1; }
make -s -C shim testbins >/dev/null

mkimage="$BIN/mkimage"
go build -o "$mkimage" ./hack/mkimage
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/pause" ./hack/pause

# The Debian packages of the bases, pinned (bookworm, as the Dockerfile's bases). Debian keeps only the
# current version of a package in its archive: when apt can no longer download one, pin the version
# `apt-cache policy` offers.
LIBC6="libc6=2.36-9+deb12u14"
BUSYBOX="busybox-static=1:1.35.0-4+deb12u1+b1"

# Bases, rebuilt only when the package list changes.
base() {
  local name="$1"; shift
  local dir="$OUT/rootfs-$name"
  if [[ "$(cat "$dir.packages" 2>/dev/null)" != "$*" || ! -f "$dir.debs" ]]; then
    hack/debian-rootfs.sh "$dir" "$@" >&2
    echo "$*" >"$dir.packages"
  fi
  echo "$dir"
}
glibc="$(base glibc "$LIBC6")"
shell="$(base shell "$LIBC6" "$BUSYBOX")"

sbom="$BIN/sbom"
go build -o "$sbom" ./hack/sbom

# image NAME REF BASE|- [-file /dest=src]... [mkimage flags]...: NAME.tar and its SPDX SBOM NAME.spdx.json.
image() {
  local name="$1" ref="$2" base="$3"; shift 3
  local layer=() debs=() files=()
  if [[ "$base" != - ]]; then layer=(-layer "$base"); debs=(-debs "$base.debs"); fi
  local args=("$@") i
  for ((i = 0; i < ${#args[@]}; i++)); do
    if [[ "${args[i]}" == -file ]]; then files+=(-file "${args[i+1]}"); fi
  done
  "$mkimage" -o "$OUT/$name.tar" -ref "$ref" "${layer[@]}" "$@"
  "$sbom" -o "$OUT/$name.spdx.json" -ref "$ref" "${debs[@]}" "${files[@]}"
}

# The manager runs as the distroless "nonroot" user, as the Dockerfile's manager stage does.
image manager "docker.io/gpusharing/manager:$TAG" "$glibc" -file "/manager=$BIN/manager" -entrypoint /manager -user 65532:65532
image agent "docker.io/gpusharing/agent:$TAG" "$shell" \
  -file "/agent=$BIN/agent" -file "/opt/gpusharing/libgpushare.so=shim/build/libgpushare.so" -entrypoint /agent
image pause "gpusharing.io/e2e/pause:1" - -file "/pause=$BIN/pause" -entrypoint /pause -user 65535:65535
image busybox "gpusharing.io/e2e/busybox:1" "$shell" -entrypoint /bin/sh
# A CUDA application for nodes without a GPU: the shim's test client over its stub driver (shim/tests), so
# the e2e can keep a process that uses libgpushare.so running through an agent upgrade.
image shim-worker "gpusharing.io/e2e/shim-worker:1" "$shell" \
  -file "/client=shim/build/tests/client" -file "/usr/lib/cuda-stub/libcuda.so.1=shim/build/stub/libcuda.so.1" \
  -env LD_LIBRARY_PATH=/usr/lib/cuda-stub -entrypoint /bin/sh
ls -l "$OUT"/*.tar "$OUT"/*.spdx.json
