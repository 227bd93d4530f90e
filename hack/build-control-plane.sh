#!/usr/bin/env bash
# Builds the real control-plane binaries that envtest runs (kube-apiserver, etcd) and a matching kubectl
# from the Go module proxy into bin/. No prebuilt binaries can be downloaded here, so we compile them.
# Each binary is skipped when bin/ already holds it at the wanted version (a stamp file records that).
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BIN:-$ROOT/bin}"
WORK="${WORK_DIR:-$BIN/.build}"
mkdir -p "$BIN" "$WORK"

# Staging modules are published as k8s.io/<name> with the version v0.<minor>.<patch>.
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"

up_to_date() { [[ -x "$BIN/$1" && "$(cat "$BIN/.$1.version" 2>/dev/null)" == "$2" ]]; }
stamp() { echo "$2" >"$BIN/.$1.version"; }

kube_module() {
  local dir="$WORK/kubernetes"
  [[ -f "$dir/go.sum" && "$(cat "$dir/.version" 2>/dev/null)" == "$KUBE_VERSION" ]] && { echo "$dir"; return; }
  rm -rf "$dir"; mkdir -p "$dir"
  local gomod
  gomod="$(cd "$dir" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
  {
    echo "module gpusharing.io/throwaway/kubernetes"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    # k8s.io/kubernetes points every staging module at ./staging, which does not exist in the module zip:
    # pin each one to its published release instead.
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#replace \1 => \1 '"$STAGING_VERSION"'#p' "$gomod"
  } >"$dir/go.mod"
  (cd "$dir" && printf 'package throwaway\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n\t_ "k8s.io/kubectl/pkg/cmd"\n)\n' >deps.go \
     && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || GOFLAGS=-mod=mod go get "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null)
  echo "$KUBE_VERSION" >"$dir/.version"
  echo "$dir"
}

kube_ldflags() {
  local v="$KUBE_VERSION" major minor
  major="${v#v}"; major="${major%%.*}"
  minor="${v#v*.}"; minor="${minor%%.*}"
  local pkg=k8s.io/component-base/version
  echo "-s -w -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z \
    -X k8s.io/client-go/pkg/version.gitVersion=$v -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor"
}

build_kube() {
  local name="$1" pkg="$2"
  up_to_date "$name" "$KUBE_VERSION" && { echo "bin/$name $KUBE_VERSION already built"; return; }
  local dir; dir="$(kube_module)"
  echo "building $name $KUBE_VERSION from the module proxy (cold: several minutes)"
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$(kube_ldflags)" -o "$BIN/$name" "$pkg")
  stamp "$name" "$KUBE_VERSION"
}

build_etcd() {
  up_to_date etcd "$ETCD_VERSION" && { echo "bin/etcd $ETCD_VERSION already built"; return; }
  local dir="$WORK/etcd"
  mkdir -p "$dir"
  echo "building etcd $ETCD_VERSION from the module proxy"
  (cd "$dir" && { [[ -f go.mod ]] || go mod init gpusharing.io/throwaway/etcd >/dev/null 2>&1; } \
     && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1 \
     && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
  stamp etcd "$ETCD_VERSION"
}

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(etcd kube-apiserver kubectl)
for t in "${targets[@]}"; do
  case "$t" in
    etcd) build_etcd ;;
    kube-apiserver) build_kube kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver ;;
    kubectl) build_kube kubectl k8s.io/kubernetes/cmd/kubectl ;;
    # The rest of a single node, for the real-node and DRA tests (not needed by `make test`).
    kube-scheduler) build_kube kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler ;;
    kube-controller-manager) build_kube kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager ;;
    kubelet) build_kube kubelet k8s.io/kubernetes/cmd/kubelet ;;
    *) echo "unknown target $t (want etcd, kube-apiserver, kubectl, kube-scheduler, kube-controller-manager, kubelet)" >&2; exit 2 ;;
  esac
done
