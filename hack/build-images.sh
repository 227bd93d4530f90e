#!/usr/bin/env bash
# build-images.sh: OCI image archives of the manager and the agent (with libgpushare.so), made without a
# container engine from the binaries `make build` produced, plus the two images the real-node e2e needs
# besides them: the pod sandbox ("pause"), a busybox for test pods and a shim workload over a stub driver. Bases are unpacked from Debian's
# packages (hack/debian-rootfs.sh): glibc for the cgo binaries, and busybox-static where a shell is wanted
# (the agent's simulated driver tools, test pods). The files the Dockerfile copies land at the same paths
# (test/images checks both against each other).
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

# Bases, rebuilt only when the package list changes.
base() {
  local name="$1"; shift
  local dir="$OUT/rootfs-$name"
  if [[ "$(cat "$dir.packages" 2>/dev/null)" != "$*" ]]; then
    hack/debian-rootfs.sh "$dir" "$@"
    echo "$*" >"$dir.packages"
  fi
  echo "$dir"
}
glibc="$(base glibc libc6)"
shell="$(base shell libc6 busybox-static)"

# The manager runs as the distroless "nonroot" user, as the Dockerfile's manager stage does.
"$mkimage" -o "$OUT/manager.tar" -ref "docker.io/gpusharing/manager:$TAG" -layer "$glibc" \
  -file "/manager=$BIN/manager" -entrypoint /manager -user 65532:65532
"$mkimage" -o "$OUT/agent.tar" -ref "docker.io/gpusharing/agent:$TAG" -layer "$shell" \
  -file "/agent=$BIN/agent" -file "/opt/gpusharing/libgpushare.so=shim/build/libgpushare.so" -entrypoint /agent
"$mkimage" -o "$OUT/pause.tar" -ref "gpusharing.io/e2e/pause:1" -file "/pause=$BIN/pause" -entrypoint /pause -user 65535:65535
"$mkimage" -o "$OUT/busybox.tar" -ref "gpusharing.io/e2e/busybox:1" -layer "$shell" -entrypoint /bin/sh
# A CUDA application for nodes without a GPU: the shim's test client over its stub driver (shim/tests), so
# the e2e can keep a process that uses libgpushare.so running through an agent upgrade.
"$mkimage" -o "$OUT/shim-worker.tar" -ref "gpusharing.io/e2e/shim-worker:1" -layer "$shell" \
  -file "/client=shim/build/tests/client" -file "/usr/lib/cuda-stub/libcuda.so.1=shim/build/stub/libcuda.so.1" \
  -env LD_LIBRARY_PATH=/usr/lib/cuda-stub -entrypoint /bin/sh
ls -l "$OUT"/*.tar
