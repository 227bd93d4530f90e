#!/usr/bin/env bash
# Builds the container runtime for the real-node e2e (make e2e) from the Go module proxy into bin/:
# containerd v2 (the daemon, its runc shim and ctr), runc, the CNI plugins of the pod network and
# NVIDIA's container runtime (the RuntimeClass nvidia's handler, in CDI mode). kubelet 1.36 wants containerd 2.x, which
# Debian does not package, and no prebuilt binary can be downloaded here, so we compile them. Each
# binary is skipped when bin/ already holds it at the wanted version (a stamp file records that).
set -euo pipefail

CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
RUNC_VERSION="${RUNC_VERSION:-v1.5.2}"
CNI_VERSION="${CNI_VERSION:-v1.9.1}"
NVIDIA_CTK_VERSION="${NVIDIA_CTK_VERSION:-v1.20.2}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BIN:-$ROOT/bin}"
WORK="${WORK_DIR:-$BIN/.build}"
mkdir -p "$BIN" "$WORK"

up_to_date() { [[ -x "$BIN/$1" && "$(cat "$BIN/.$1.version" 2>/dev/null)" == "$2" ]]; }
stamp() { echo "$2" >"$BIN/.$1.version"; }

# throwaway_module DIR MODULE@VERSION: a module that requires MODULE, so `go build MODULE/cmd/...` works.
throwaway_module() {
  local dir="$1" dep="$2"
  [[ -f "$dir/go.sum" && "$(cat "$dir/.version" 2>/dev/null)" == "$dep" ]] && return
  rm -rf "$dir"; mkdir -p "$dir"
  (cd "$dir" && go mod init "gpusharing.io/throwaway/$(basename "$dir")" >/dev/null 2>&1 \
     && GOFLAGS=-mod=mod go get "$dep" >/dev/null)
  echo "$dep" >"$dir/.version"
}

build_containerd() {
  local all=1
  for b in containerd containerd-shim-runc-v2 ctr; do up_to_date "$b" "$CONTAINERD_VERSION" || all=0; done
  [[ $all == 1 ]] && { echo "bin/containerd $CONTAINERD_VERSION already built"; return; }
  local dir="$WORK/containerd" mod=github.com/containerd/containerd/v2
  throwaway_module "$dir" "$mod@$CONTAINERD_VERSION"
  echo "building containerd $CONTAINERD_VERSION from the module proxy (cold: several minutes)"
  # No btrfs or devmapper snapshotters (cgo and headers we do not need): overlayfs and native suffice.
  local flags=(-trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w -X $mod/version.Version=$CONTAINERD_VERSION")
  for b in containerd containerd-shim-runc-v2 ctr; do
    (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build "${flags[@]}" -o "$BIN/$b" "$mod/cmd/$b")
    stamp "$b" "$CONTAINERD_VERSION"
  done
}

build_runc() {
  up_to_date runc "$RUNC_VERSION-seccomp" && { echo "bin/runc $RUNC_VERSION already built"; return; }
  local dir="$WORK/runc" mod=github.com/opencontainers/runc
  throwaway_module "$dir" "$mod@$RUNC_VERSION"
  # Pods ask for seccompProfile RuntimeDefault (the manager does), which runc refuses without libseccomp.
  if ! pkg-config --exists libseccomp 2>/dev/null; then
    apt-get install -y libseccomp-dev >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y libseccomp-dev >/dev/null; }
  fi
  echo "building runc $RUNC_VERSION (with seccomp) from the module proxy"
  # runc's nsenter is C, and seccomp links libseccomp: both need cgo.
  (cd "$dir" && CGO_ENABLED=1 GOFLAGS=-mod=mod go build -trimpath -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" -o "$BIN/runc" "$mod")
  stamp runc "$RUNC_VERSION-seccomp"
}

# CNI plugins give the node a pod network (a bridge on loopback-only addresses): without one the kubelet
# reports the node NotReady and no pod is scheduled. Installed under bin/cni, containerd's bin_dir.
build_cni() {
  local plugins=(bridge host-local loopback)
  [[ "$(cat "$BIN/.cni.version" 2>/dev/null)" == "$CNI_VERSION" ]] && { echo "bin/cni $CNI_VERSION already built"; return; }
  local dir="$WORK/cni" mod=github.com/containernetworking/plugins
  throwaway_module "$dir" "$mod@$CNI_VERSION"
  echo "building CNI plugins $CNI_VERSION from the module proxy"
  mkdir -p "$BIN/cni"
  for p in "${plugins[@]}"; do
    local pkg="$mod/plugins/main/$p"
    [[ $p == host-local ]] && pkg="$mod/plugins/ipam/$p"
    (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$BIN/cni/$p" "$pkg")
  done
  stamp cni "$CNI_VERSION"
}

# NVIDIA's container runtime, the handler of the RuntimeClass nvidia on a GPU node: the e2e runs it in CDI
# mode with its hardened setting (accept-nvidia-visible-devices-envvar-when-unprivileged = false) over
# stand-in device nodes, to show that a pod gets only the device nodes of its share. Its CUDA package
# is cgo (it reads the driver's version through dlopen at run time, not at link time: no driver needed).
build_nvidia() {
  up_to_date nvidia-container-runtime "$NVIDIA_CTK_VERSION" && { echo "bin/nvidia-container-runtime $NVIDIA_CTK_VERSION already built"; return; }
  local dir="$WORK/nvidia-container-toolkit" mod=github.com/NVIDIA/nvidia-container-toolkit
  throwaway_module "$dir" "$mod@$NVIDIA_CTK_VERSION"
  echo "building nvidia-container-runtime $NVIDIA_CTK_VERSION from the module proxy"
  (cd "$dir" && CGO_ENABLED=1 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$BIN/nvidia-container-runtime" "$mod/cmd/nvidia-container-runtime")
  stamp nvidia-container-runtime "$NVIDIA_CTK_VERSION"
}

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(containerd runc cni nvidia)
for t in "${targets[@]}"; do
  case "$t" in
    containerd) build_containerd ;;
    runc) build_runc ;;
    cni) build_cni ;;
    nvidia) build_nvidia ;;
    *) echo "unknown target $t (want containerd, runc, cni, nvidia)" >&2; exit 2 ;;
  esac
done
