#!/usr/bin/env bash
# Copies what the chart shares with config/ into charts/gpusharing/files, so that there is one source of
# truth: the CRDs and ClusterRoles (generated from the code by `make manifests`), the admission policies and
# the Grafana dashboard, the DRA DeviceClasses, the production classes' quota recipe. The chart's templates read these files; `make verify-generated` fails when the
# copies are stale, and test/deploy compares what the chart renders with what kustomize renders.
set -euo pipefail
cd "$(dirname "$0")/.."
files=charts/gpusharing/files
rm -rf "$files/crds" "$files/rbac" "$files/admission" "$files/dra" "$files/prometheus" "$files/qos-quota"
mkdir -p "$files/crds" "$files/rbac" "$files/admission" "$files/dashboards" "$files/dra" "$files/prometheus" "$files/qos-quota"
cp config/crd/bases/*.yaml "$files/crds/"
cp config/rbac/manager/role.yaml "$files/rbac/manager-role.yaml"
cp config/rbac/agent/role.yaml "$files/rbac/agent-role.yaml"
cp config/rbac/agent-dra/role.yaml "$files/rbac/agent-dra-role.yaml"
cp config/rbac/metrics_reader_role.yaml "$files/rbac/metrics-reader-role.yaml"
cp config/admission/*_policy.yaml config/admission/rightsizing/*_policy.yaml "$files/admission/"
cp config/dra/deviceclasses.yaml config/dra/deviceclasses-mig.yaml "$files/dra/"
cp config/prometheus/alerts.yaml "$files/prometheus/"
cp config/qos-quota/{priorityclass,system-grants,production-grant,tenant-deny}.yaml "$files/qos-quota/"
if [[ -f config/grafana/gpusharing.json ]]; then cp config/grafana/gpusharing.json "$files/dashboards/"; fi
