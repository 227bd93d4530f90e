# gpusharing — build, generate and test. `make help` lists the targets.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

BIN ?= $(CURDIR)/bin
CONTROLLER_TOOLS_VERSION ?= v0.21.0
CONTROLLER_GEN ?= $(BIN)/controller-gen
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT ?= $(BIN)/golangci-lint
GO_TEST_FLAGS ?= -count=1
# make vulncheck: govulncheck, and the Go vulnerability database snapshot it checks against (a module).
GOVULNCHECK_VERSION ?= v1.10.0
VULNDB_VERSION ?= v0.0.0-20261105234957-e22db6528018
# Real control-plane binaries for envtest, built from the module proxy by hack/build-control-plane.sh.
export KUBEBUILDER_ASSETS := $(BIN)
export KUBECTL := $(BIN)/kubectl
# The chart tests run helm from here.
export HELM := $(BIN)/helm

.PHONY: help
help: ## List the targets by section (hack/check-make-help.sh checks that every target is here)
	@awk 'BEGIN {FS = ":.*## "} /^##@ / {printf "\n%s\n", substr($$0, 5); next} /^[A-Za-z0-9][A-Za-z0-9_.-]*:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Run
.PHONY: demo
demo: control-plane ## The main job: a local control plane, the controller and simulated GPU nodes (DEMO_ARGS=--once for CI)
	go run ./cmd/demo $(DEMO_ARGS)

##@ Generate
# Every agent package but agent/dra, whose markers make the agent-dra role (';' separates controller-gen paths).
AGENT_PKGS_BUT_DRA = $(shell go list ./agent/... | grep -vx '.*/agent/dra' | paste -sd';')
.PHONY: manifests generate
manifests: $(CONTROLLER_GEN) ## Generate CRDs and RBAC from the API types and markers
	$(CONTROLLER_GEN) crd paths="./api/..." output:crd:artifacts:config=config/crd/bases
	@# One least-privilege role per component, each from its own code's +kubebuilder:rbac markers and those
	@# of the internal/ packages it serves through (internal/metricsauth: the metrics endpoint's reviews).
	@if grep -rqs '+kubebuilder:rbac' controllers; then $(CONTROLLER_GEN) rbac:roleName=manager paths="./controllers/...;./internal/metricsauth/..." output:rbac:artifacts:config=config/rbac/manager; fi
	@# The agent's DRA rights (ResourceSlices, ResourceClaims) are a role of their own, bound only where DRA is on.
	$(CONTROLLER_GEN) rbac:roleName=agent paths="$(AGENT_PKGS_BUT_DRA);./internal/metricsauth/..." output:rbac:artifacts:config=config/rbac/agent
	$(CONTROLLER_GEN) rbac:roleName=agent-dra paths="./agent/dra" output:rbac:artifacts:config=config/rbac/agent-dra
	@$(MAKE) --no-print-directory chart

generate: $(CONTROLLER_GEN) ## Generate deepcopy functions and docs/reference (API fields, conditions and reasons, each binary's flags)
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths="./api/..."
	@# Each binary's flag reference is written by its own test, over its real flag sets.
	UPDATE_REFERENCE=1 go test -count=1 -run '^TestFlagReference$$' ./cmd/agent ./cmd/manager ./cmd/gpushare-scheduler
	@# Fails on a type, field or reason without its comment (a reason's must say "What to do:") and on a
	@# guide naming a --flag the flag references above do not list.
	go run ./hack/refdocs

.PHONY: chart
chart: ## Copy the CRDs, ClusterRoles, admission policy and dashboard from config/ into charts/gpusharing/files (run by manifests)
	hack/sync-chart.sh

.PHONY: verify-generated
verify-generated: $(CONTROLLER_GEN) ## Fail when generated files differ from what the generators write
	hack/verify-generated.sh

##@ Build
.PHONY: build
build: ## Build the manager and agent binaries and the shim
	CGO_ENABLED=1 go build -o $(BIN)/manager ./cmd/manager
	CGO_ENABLED=1 go build -o $(BIN)/agent ./cmd/agent
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim all; fi

.PHONY: control-plane
control-plane: ## Build kube-apiserver, etcd, kubectl, kube-scheduler and kube-controller-manager v1.36.3 into bin/ (skipped when present)
	@# kube-controller-manager: the DRA tests run its resourceclaim controller, which frees a deleted claim's capacity.
	hack/build-control-plane.sh etcd kube-apiserver kubectl kube-scheduler kube-controller-manager

.PHONY: helm
helm: ## Build the helm CLI v3.22.0 into bin/ from the module proxy (skipped when present)
	BIN=$(BIN) hack/build-helm.sh

##@ Test
.PHONY: fmt vet lint
fmt: ## Fail on unformatted Go files
	@out="$$(gofmt -l $$(git ls-files '*.go' | grep -v '^bin/') 2>&1)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
vet: ## go vet every package
	go vet ./...
lint: fmt vet golangci-lint check-docs check-make-help ## gofmt, go vet, golangci-lint (.golangci.yml: layering, environment, exec), the docs' links and tables, make help
	$(GOLANGCI_LINT) run ./...

.PHONY: check-docs
check-docs: ## Links, anchors and tables of every Markdown file; reference form of the docs (no journal, no result without its command); docs/reference complete and current
	hack/check-docs_test.sh
	hack/check-docs.sh
	go run ./hack/refdocs -check

.PHONY: check-make-help
check-make-help: ## Every target has a help line and make help lists it under its section
	hack/check-make-help_test.sh
	hack/check-make-help.sh

.PHONY: golangci-lint
golangci-lint: ## Build golangci-lint $(GOLANGCI_LINT_VERSION) from the module proxy into $(BIN) (skipped when present)
	BIN=$(BIN) GOLANGCI_LINT_VERSION=$(GOLANGCI_LINT_VERSION) hack/build-golangci-lint.sh

.PHONY: helm-lint
helm-lint: helm ## helm lint the chart, with the defaults and with every optional part on
	$(BIN)/helm lint charts/gpusharing
	$(BIN)/helm lint charts/gpusharing --set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true --set grafana.dashboard.enabled=true --set runtimeClass.create=true --set productionClasses.enabled=true --set productionClasses.grantNamespaces={serving} --set productionClasses.denyNamespaces={tenant} --set networkPolicy.enabled=true

.PHONY: vulncheck
vulncheck: ## govulncheck against golang.org/x/vulndb $(VULNDB_VERSION), fetched from the Go module proxy like any module; fails on a called vulnerability hack/vulncheck-accepted.txt does not accept
	BIN=$(BIN) GOVULNCHECK_VERSION=$(GOVULNCHECK_VERSION) VULNDB_VERSION=$(VULNDB_VERSION) hack/vulncheck.sh

.PHONY: test
test: control-plane helm verify-generated lint helm-lint vulncheck ## The test command: unit, envtest (real apiserver), chart and shim suites, vulnerability check
	go test $(GO_TEST_FLAGS) ./...
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim test; fi

.PHONY: flake-check
flake-check: control-plane helm ## Run the timing-sensitive suites N times each and report every failure (N=5)
	hack/flake-check.sh $(or $(N),5)

.PHONY: test-go
test-go: control-plane helm ## Only the Go suites
	go test $(GO_TEST_FLAGS) ./...

.PHONY: soak
soak: ## Seeded soak of the shim, scheduler, ledgers and guard on the stub driver, checking invariants (SOAK_DURATION=10m, SOAK_SEED, SOAK_SEEDS=n, SOAK_WITHOUT=faults)
	$(MAKE) -C shim testbins
	SOAK_DURATION=$(or $(SOAK_DURATION),10m) SOAK_SEED=$(SOAK_SEED) SOAK_SEEDS=$(SOAK_SEEDS) SOAK_WITHOUT=$(SOAK_WITHOUT) \
		SOAK_SHIM_BUILD=$(CURDIR)/shim/build \
		go test -count=1 -timeout 0 -v -run '^TestSoak$$' ./test/soak

##@ End to end
.PHONY: e2e-deps images e2e
e2e-deps: control-plane ## Build the rest of a real node into bin/: kubelet, containerd v2, runc, CNI plugins; install Debian's prometheus
	BIN=$(BIN) hack/build-control-plane.sh kubelet
	BIN=$(BIN) hack/build-runtime.sh
	@# The Usage scenario scrapes the installed operator with a real Prometheus (root, as the e2e is).
	command -v prometheus >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; }

images: build ## OCI image archives of the manager and the agent (plus pause and busybox for the e2e) into bin/images, without Docker
	BIN=$(BIN) hack/build-images.sh

e2e: e2e-deps images ## The real-node end-to-end test (root, Linux): a real kubelet, containerd and control plane here; installs config/e2e and runs test/e2e
	E2E_BIN=$(BIN) go test -tags e2e $(GO_TEST_FLAGS) -timeout 45m -v ./test/e2e/


##@ Benchmarks
.PHONY: bench-controller
bench-controller: control-plane ## Controller convergence at scale against the real API server (BENCH_ARGS="-nodes 1000")
	go run ./test/bench/controller $(BENCH_ARGS)

.PHONY: bench-rightsizing
bench-rightsizing: control-plane ## Right-sizing's cost at fleet scale: heap, CPU per sample pass, API writes per minute (BENCH_ARGS="-nodes 1000")
	go run ./test/bench/rightsizing $(BENCH_ARGS)

.PHONY: stack-bin
stack-bin: control-plane ## Binaries for test/gpu/stack/run.sh on the GPU machine, xz-compressed into test/gpu/stack/bin (copy that folder along)
	mkdir -p test/gpu/stack/bin $(BIN)/stack
	CGO_ENABLED=1 go build -ldflags "-s -w" -o $(BIN)/stack/manager ./cmd/manager
	CGO_ENABLED=1 go build -ldflags "-s -w" -o $(BIN)/stack/agent ./cmd/agent
	go build -ldflags "-s -w" -o $(BIN)/stack/stackcheck ./test/gpu/stack/stackcheck
	for f in etcd kube-apiserver kubectl; do cp $(BIN)/$$f $(BIN)/stack/; done
	rm -f test/gpu/stack/bin/*.xz
	xz -T2 -9e -c $(BIN)/stack/etcd > test/gpu/stack/bin/etcd.xz
	# Binaries that share most of their code go in one solid stream with a dictionary larger than them all,
	# which keeps the folder small to copy to the GPU machine: kube-apiserver and kubectl (5 MB smaller than
	# two streams), and our three (client-go, controller-runtime: 9 MB smaller).
	tar cf - -C $(BIN)/stack kube-apiserver kubectl | xz -T1 --lzma2=preset=9e,dict=256MiB > test/gpu/stack/bin/k8s.tar.xz
	tar cf - -C $(BIN)/stack agent manager stackcheck | xz -T1 --lzma2=preset=6,dict=192MiB > test/gpu/stack/bin/gpusharing.tar.xz
	@du -sh test/gpu/stack/bin

.PHONY: bench-accounting
bench-accounting: ## Agent CPU for per-pod accounting: 8 mock GPUs, 64 processes, at the default interval (BENCH_ARGS="-reads 2000")
	go run ./test/bench/accounting $(BENCH_ARGS)

.PHONY: bench-dynmig
bench-dynmig: ## Claim to prepared on a dynamic MIG placement (instance created) against a fixed instance, side by side on a mocked H100 (BENCH_ARGS="-claims 500")
	go run ./test/bench/dynmig $(BENCH_ARGS)

.PHONY: acctcheck-bin
acctcheck-bin: ## Build test/gpu/accounting/bin/acctcheck for test/gpu/accounting/run.sh on the GPU machine (copy that folder along)
	mkdir -p test/gpu/accounting/bin
	CGO_ENABLED=1 go build -ldflags "-s -w" -o test/gpu/accounting/bin/acctcheck ./test/gpu/accounting/acctcheck

.PHONY: unmanaged-bin
unmanaged-bin: ## Build test/gpu/unmanaged/bin/umcheck for test/gpu/unmanaged/run.sh on the GPU machine (copy that folder along)
	mkdir -p test/gpu/unmanaged/bin
	CGO_ENABLED=1 go build -ldflags "-s -w" -o test/gpu/unmanaged/bin/umcheck ./test/gpu/unmanaged/umcheck

.PHONY: bench-shim
bench-shim: ## Shim launch tax, hand-off and idle release (needs a GPU)
	$(MAKE) -C shim bench

.PHONY: bench-oversub
bench-oversub: ## Oversubscription swap rate and paired-job completion times (needs a GPU)
	$(MAKE) -C shim bench-oversub

.PHONY: bench-qos
bench-qos: ## Production inference beside opportunistic training in every sharing mode, side by side (needs a GPU and shim/build/gpushare-scheduler, built where Go is)
	test/gpu/qos/bench.sh

$(CONTROLLER_GEN):
	GOBIN=$(BIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)

##@ Clean
.PHONY: clean
clean: ## Remove build outputs (keeps the cached control plane)
	rm -f $(BIN)/manager $(BIN)/agent
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim clean; fi
