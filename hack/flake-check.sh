#!/usr/bin/env bash
# flake-check.sh N: runs the timing-sensitive suites N times each and reports every failure (package, run
# number, failing tests). Exits non-zero when any run failed.
#
# Each Go package's test binary is built once and run N times in the package's directory (as go test runs
# it), so the runs measure the tests, not the compiler; the shim's suites run through `make -C shim test`.
# FLAKE_PKGS (Go package patterns) replaces the default list; FLAKE_SHIM=0 leaves the shim out;
# FLAKE_TIMEOUT bounds one run of one package (default 20m); FLAKE_LOGS keeps the logs (default: a
# temporary directory, printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

n=${1:-}
if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N   (N >= 1: how many times each suite runs)" >&2
  exit 2
fi
pkgs=${FLAKE_PKGS:-./agent/scheduler ./agent/node ./agent/app ./test/faults ./controllers/...}
timeout=${FLAKE_TIMEOUT:-20m}
logs=${FLAKE_LOGS:-$(mktemp -d /tmp/flake-check.XXXXXX)}
mkdir -p "$logs"

# The envtest suites' control plane and tools, as the Makefile exports them.
export KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$root/bin}
export KUBECTL=${KUBECTL:-$root/bin/kubectl}
export HELM=${HELM:-$root/bin/helm}

failures=()
runs=0
start=$SECONDS

# run_go PKG: builds PKG's test binary once and runs it N times.
run_go() {
  local pkg=$1 dir name bin
  dir=$(go list -f '{{.Dir}}' "$pkg")
  name=$(go list -f '{{.ImportPath}}' "$pkg")
  name=${name#github.com/gpusharing/gpusharing/}
  bin="$logs/$(echo "$name" | tr / _).test"
  if ! go test -c -o "$bin" "$pkg" >"$logs/$(basename "$bin" .test).build.log" 2>&1; then
    failures+=("$name: the test binary does not build (log: $logs/$(basename "$bin" .test).build.log)")
    echo "BUILD FAIL $name"
    return
  fi
  [[ -x "$bin" ]] || return 0 # no test files
  local i log t0 rc
  for ((i = 1; i <= n; i++)); do
    log="$logs/$(basename "$bin" .test).run$i.log"
    t0=$SECONDS
    rc=0
    (cd "$dir" && "$bin" -test.count=1 -test.v -test.timeout="$timeout") >"$log" 2>&1 || rc=$?
    runs=$((runs + 1))
    if ((rc == 0)); then
      echo "ok    $name run $i/$n ($((SECONDS - t0))s)"
      continue
    fi
    local tests
    tests=$(grep -oE -- '--- FAIL: [^ ]+' "$log" | awk '{print $3}' | paste -sd' ' - || true)
    if grep -q '^panic: test timed out' "$log"; then
      tests="${tests:+$tests }(timed out after $timeout)"
    fi
    failures+=("$name run $i: ${tests:-exit $rc, no failing test named} (log: $log)")
    echo "FAIL  $name run $i/$n ($((SECONDS - t0))s): ${tests:-exit $rc}"
  done
}

# run_shim: the shim's C suites, N times.
run_shim() {
  local i log t0 rc
  for ((i = 1; i <= n; i++)); do
    log="$logs/shim.run$i.log"
    t0=$SECONDS
    rc=0
    make -s -C shim test >"$log" 2>&1 || rc=$?
    runs=$((runs + 1))
    if ((rc == 0)); then
      echo "ok    shim run $i/$n ($((SECONDS - t0))s)"
      continue
    fi
    local tests
    tests=$(grep -E '^FAIL ' "$log" | sed -E 's/^FAIL ([^:]+):.*/\1/' | paste -sd' ' - || true)
    failures+=("shim run $i: ${tests:-exit $rc, no failing test named} (log: $log)")
    echo "FAIL  shim run $i/$n ($((SECONDS - t0))s): ${tests:-exit $rc}"
  done
}

for pkg in $(go list $pkgs); do
  run_go "$pkg"
done
if [[ "${FLAKE_SHIM:-1}" != 0 && -f shim/Makefile ]]; then
  run_shim
fi

echo
echo "flake-check: $runs runs ($n per suite) in $((SECONDS - start))s; logs in $logs"
if ((${#failures[@]})); then
  echo "${#failures[@]} failed:"
  printf '  %s\n' "${failures[@]}"
  exit 1
fi
echo "no failure"
