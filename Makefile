# Skiff's verbs. `make help` lists them. CI calls only `make test` (.ci/run).

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

ROOT := $(CURDIR)
BIN := $(ROOT)/bin
# Modules in go.work; `go test ./...` does not cross modules.
MODULES := $(shell go list -m -f '{{.Dir}}')
TOOLS := buf controller-gen crd-ref-docs golangci-lint gremlins helm kind openapi-gen protoc-gen-connect-go protoc-gen-go
# The fleet lanes (e2e/fleet) alone take about five minutes: more than go
# test's default ten-minute limit allows beside the other packages.
# GO_TEST_P packages run at once: most of the longest wait on sandboxes,
# control planes and SDK suites, so that with two the 2-core machine idled
# about 40% of the run.
GO_TEST_P ?= 3
GO_TEST_FLAGS ?= -race -count=1 -timeout 30m -p $(GO_TEST_P)
# go-test's packages: every module's in one go test, so that no slot
# idles while a module's longest package ends (module by module, each of
# apiserver's, e2e's and sandboxd's ran alone for minutes), and the longest
# first, so that none of them starts last. TEST_PKGS narrows it (e.g.
# TEST_PKGS=./shared/...).
LONGEST_TEST_PKGS := ./e2e/sdk ./e2e/fleet ./e2e/upstream ./apiserver/internal/e2e ./sandboxd/internal/e2e
TEST_PKGS ?= $(LONGEST_TEST_PKGS) $(patsubst $(ROOT)/%,./%/...,$(MODULES))
BENCH ?= .
BENCHTIME ?= 2s

export KUBEBUILDER_ASSETS ?= $(shell hack/kube/build.sh --print)
# sandboxd's native runtime needs libcontainer's seccomp support: cgo and
# libseccomp-dev. The tag changes nothing in the other modules.
export GOFLAGS := -tags=seccomp
# The envd the sandbox tests bind into their sandboxes (built by `make envd`).
export SKIFF_ENVD := $(BIN)/envd
# gVisor's runsc, which the gvisor runtime's tests run (built by `make runsc`).
export SKIFF_RUNSC ?= $(shell hack/runsc/build.sh --print)
# The binaries the whole-system tests (e2e/) run (built by `make build`).
export SKIFF_BIN := $(BIN)

.PHONY: help
help: ## Show the verbs.
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: tools
tools: $(addprefix $(BIN)/,$(TOOLS)) ## Build the pinned tools (tools/) into bin/.

# Each tool is its own module under tools/, so its build is keyed by its go.mod.
$(BIN)/%: tools/%/go.mod tools/%/go.sum
	@mkdir -p $(BIN)
	cd tools/$* && GOWORK=off go build -trimpath -ldflags "$(LDFLAGS_$*)" -o $(BIN)/$* $$(sed -n 's/^tool //p' go.mod)

# helm's release build stamps its version and the Kubernetes version its
# templates and lint assume (.Capabilities.KubeVersion), else v1.20: the
# client-go minor of tools/helm/go.mod.
HELM_VERSION = $(shell sed -n 's|^\thelm.sh/helm/v3 \(v[0-9.]*\).*|\1|p' tools/helm/go.mod)
HELM_K8S_MINOR = $(shell sed -n 's|^\tk8s.io/client-go v0\.\([0-9]*\)\..*|\1|p' tools/helm/go.mod)
LDFLAGS_helm = -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(HELM_K8S_MINOR) \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(HELM_K8S_MINOR)

.PHONY: runsc
runsc: ## Build gVisor's runsc from the Go module proxy into the cache (no-op when present).
	hack/runsc/build.sh

.PHONY: kube-bins
kube-bins: ## Build etcd, kube-apiserver and kubectl from Go modules into the cache (no-op when present).
	hack/kube/build.sh

.PHONY: generate
generate: $(addprefix $(BIN)/,controller-gen crd-ref-docs buf openapi-gen protoc-gen-go protoc-gen-connect-go) ## Regenerate deepcopy, CRDs (api/crds), the aggregated API's OpenAPI, protobuf code, docs/api.md, docs/configuration.md, the chart's copies, schema and values table, and third_party/runc.
	for m in $(MODULES); do (cd $$m && go generate ./...); done
	$(BIN)/crd-ref-docs --source-path=api/v1beta1 --config=hack/crd-ref-docs/config.yaml \
		--renderer=markdown --output-path=docs/api.md --log-level=ERROR
	cd hack/flagdocs && GOWORK=off go run . $(ROOT) docs/configuration.md
	hack/runc-fork/update.sh >/dev/null
	$(MAKE) chart-sources

# The chart's CRDs and admission policies are copies of api/'s (Helm reads
# only files inside the chart); its schema and README's values table come
# from values.yaml. e2e/chart's tests fail when the copies differ.
.PHONY: chart-sources
chart-sources:
	rm -rf charts/skiff/crds charts/skiff/files/policies
	mkdir -p charts/skiff/crds charts/skiff/files/policies
	cp api/crds/*.yaml charts/skiff/crds/
	cp api/policies/*.yaml charts/skiff/files/policies/
	cd hack/chartdocs && GOWORK=off go run . $(ROOT)/charts/skiff

.PHONY: fmt
fmt: ## gofmt every Go file.
	gofmt -s -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## go vet every module.
	for m in $(MODULES); do (cd $$m && go vet ./...); done

# Every module with a go.mod: the workspace's, the pinned tools' and hack's.
ALL_MODULES = $(MODULES) $(wildcard tools/*) $(wildcard hack/kube/*/) hack/runsc hack/flagdocs hack/chartdocs

.PHONY: tidy
tidy: ## go mod tidy every module (workspace, tools and hack).
	for m in $(ALL_MODULES); do (cd $$m && GOWORK=off go mod tidy); done

.PHONY: sync
sync: ## After adding or bumping a dependency: go work sync (every module requires what the workspace selects), then tidy.
	go work sync
	$(MAKE) tidy

.PHONY: lint
lint: $(BIN)/golangci-lint ## golangci-lint every module.
	for m in $(MODULES); do (cd $$m && $(BIN)/golangci-lint run --config $(ROOT)/.golangci.yml ./...); done

.PHONY: verify
verify: generate ## generate (code, CRDs, docs/api.md, docs/configuration.md) + gofmt + vet + workspace sync + tidy + GOWORK=off builds + lint, then fail on any diff.
	@out=$$(gofmt -s -l $$(git ls-files '*.go')); if [[ -n "$$out" ]]; then echo "gofmt -s needed:"; echo "$$out"; exit 1; fi
	$(MAKE) vet
	go work sync
	for m in $(ALL_MODULES); do (cd $$m && GOWORK=off go mod tidy); done
	@if [[ -n "$$(git status --porcelain -- '*go.mod' '*go.sum')" ]]; then echo "the modules are not in sync with the workspace, or not tidy: run make sync and commit"; git status --porcelain -- '*go.mod' '*go.sum'; exit 1; fi
	for m in $(MODULES); do (cd $$m && GOWORK=off go build ./... && GOWORK=off go vet ./...) || { echo "$$m does not build with GOWORK=off"; exit 1; }; done
	$(MAKE) lint
	@if [[ -n "$$(git status --porcelain)" ]]; then echo "verify left a diff (commit generated files):"; git status --porcelain; git diff --stat; exit 1; fi

.PHONY: test
test: kube-bins go-test fuzz mutate sdk-test ## Every test: Go (with -race, on a real kube-apiserver and etcd), fuzzing, mutation testing of the freshness filter, the e2b SDK suite.

.PHONY: go-test
go-test: kube-bins build runsc sdk-deps $(BIN)/helm ## The Go tests of every module (e2e/sdk: the SDK suite against the whole system; e2e/chart: the Helm chart).
	go test $(GO_TEST_FLAGS) $(TEST_PKGS)

# A count, not a duration: Go 1.26's fuzz coordinator can fail a target with
# "context deadline exceeded" when a duration runs out (golang/go#75804,
# fixed in Go 1.27).
FUZZTIME ?= 20000x
# Each new input that widens coverage is minimised, for up to 60 s by
# default, with the count of executions standing still meanwhile: envdlog's
# target (45 reads of a file each) spent three of its four and a half
# minutes so. A bound in runs keeps CI's time; a failure's input is still
# kept, minimised as far as the bound allows.
FUZZMINIMIZE ?= 1000x

.PHONY: fuzz
fuzz: ## Run every Go fuzz target for FUZZTIME (20000x) executions beyond its seeds.
	for f in $$(grep -rl --include='*_test.go' '^func Fuzz' $(MODULES)); do \
		for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			(cd $$(dirname $$f) && go test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) .) || exit 1; \
		done; \
	done

E2B_SDKS ?= e2b e2b-2.50.0

.PHONY: envd
envd: ## Build the static envd binary into bin/envd.
	cd envd && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o $(BIN)/envd ./cmd/envd

.PHONY: sandboxd
sandboxd: envd ## Build sandboxd (cgo, seccomp) into bin/sandboxd, beside the envd it runs in sandboxes and sandboxd-init, each sandbox's init (static).
	cd sandboxd && CGO_ENABLED=1 go build -trimpath -ldflags '$(GO_LDFLAGS)' -o $(BIN)/sandboxd ./cmd/sandboxd
	cd sandboxd && CGO_ENABLED=1 go build -trimpath -tags 'seccomp netgo osusergo' -ldflags '-s -w -linkmode external -extldflags -static' -o $(BIN)/sandboxd-init ./cmd/sandboxd-init

.PHONY: build
build: sandboxd ## Build every binary into bin/: sandboxd, envd, sandbox-apiserver, sandbox-envd-proxy, vk-sandbox.
	cd apiserver && CGO_ENABLED=0 go build -trimpath -ldflags '$(GO_LDFLAGS)' -o $(BIN)/sandbox-apiserver ./cmd/sandbox-apiserver
	cd envd-proxy && CGO_ENABLED=0 go build -trimpath -ldflags '$(GO_LDFLAGS)' -o $(BIN)/sandbox-envd-proxy ./cmd/sandbox-envd-proxy
	cd vk-sandbox && CGO_ENABLED=0 go build -trimpath -ldflags '$(GO_LDFLAGS)' -o $(BIN)/vk-sandbox ./cmd/vk-sandbox

# The image the Helm chart runs: its repository and tag (the chart's
# appVersion).
IMAGE ?= ghcr.io/skiff-dev/skiff:$(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/skiff/Chart.yaml)

# Extra linker flags of make build's binaries (the image's are stripped).
GO_LDFLAGS ?=

.PHONY: image
image: runsc ## Build the chart's image (IMAGE) as bin/skiff-image.tar, a docker-archive (Debian through debootstrap, no daemon or registry); as root.
	$(MAKE) build BIN=$(BIN)/image GO_LDFLAGS='-s -w'
	cd sandboxd && go run ./cmd/skiff-image --bin $(BIN)/image --runsc $(SKIFF_RUNSC) --output $(BIN)/skiff-image.tar --tag $(IMAGE)

.PHONY: sdk-deps
sdk-deps: ## Install the pinned e2b SDKs (npm ci) of the SDK suites, and vitest for e2b's own tests (e2e/upstream).
	cd envd/test/sdk && npm ci --no-audit --no-fund --loglevel=error
	cd e2e/sdk && npm ci --no-audit --no-fund --loglevel=error
	cd e2e/upstream/js && npm ci --no-audit --no-fund --loglevel=error

.PHONY: sdk-test
sdk-test: envd sdk-deps ## The unmodified e2b JS SDK (E2B_SDKS: 2.51.0 and 2.50.0) against a real envd (the whole system's suite is e2e/sdk, in go-test).
	for sdk in $(E2B_SDKS); do (cd envd/test/sdk && ENVD_BIN=$(BIN)/envd E2B_PACKAGE=$$sdk node --test --test-concurrency=1 sdk.test.mjs) || exit 1; done

.PHONY: bench
bench: kube-bins build runsc ## Benchmarks (BENCH=regexp, BENCHTIME=2s); e2e/bench runs the whole system.
	for m in $(MODULES); do (cd $$m && go test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem ./...); done

# The fleet simulator (e2e/cmd/skiff-fleetsim): simulated hosts publishing
# real NodeInventories on the real cadence to a real etcd and
# kube-apiserver, read by the real sandbox-apiserver and sandbox-envd-proxy
# of bin/. The issue's sizes: FLEET_HOSTS=50 and FLEET_HOSTS=200.
FLEET_HOSTS ?= 50
FLEET_SANDBOXES ?= 2000
FLEET_TEAMS ?= 20
FLEET_INTERVAL ?= 30s
FLEET_STEADY ?= 90s
FLEET_CHURN ?= 0.01
FLEET_OUT ?= $(BIN)/fleetsim.jsonl
FLEET_FLAGS ?=

DENSITY_SANDBOXES ?= 1000
DENSITY_BEYOND ?= 1000
LIFECYCLE_COUNT ?= 400
LIFECYCLE_CONCURRENCY ?= 1,4,20
BENCH_OUT ?= $(BIN)/hostbench.jsonl
BENCH_FLAGS ?=

.PHONY: bench-density
bench-density: build ## One host through make up's system, as root: DENSITY_SANDBOXES (1000) idle sandboxes, then DENSITY_BEYOND more to find the first limit; memory per sandbox, create p50/p99 per hundred, idle CPU, kill-all time; appends JSON lines to BENCH_OUT. Not in make test.
	cd e2e && go build -o $(BIN)/skiff-bench ./cmd/skiff-bench
	$(BIN)/skiff-bench density --bin $(BIN) --sandboxes $(DENSITY_SANDBOXES) --beyond $(DENSITY_BEYOND) --out $(BENCH_OUT) $(BENCH_FLAGS)

.PHONY: bench-lifecycle
bench-lifecycle: build ## One host, as root: LIFECYCLE_COUNT create → run → kill lifecycles at each of LIFECYCLE_CONCURRENCY, beside the floor (clone into new namespaces + exec of a static binary): rate, latencies, CPU per lifecycle; appends JSON lines to BENCH_OUT. Not in make test.
	cd e2e && go build -o $(BIN)/skiff-bench ./cmd/skiff-bench
	$(BIN)/skiff-bench lifecycle --bin $(BIN) --count $(LIFECYCLE_COUNT) --concurrency $(LIFECYCLE_CONCURRENCY) --out $(BENCH_OUT) $(BENCH_FLAGS)

.PHONY: plots
plots: ## Redraw docs/scaling/*.png from the benchmarks' results kept in docs/scaling/*.jsonl (see docs/scaling-design.md).
	cd e2e && go run ./cmd/skiff-plot --out ../docs/scaling \
		--series before=../docs/scaling/density-before.jsonl --series after=../docs/scaling/density-after.jsonl \
		--series "bash -l -c true"=../docs/scaling/lifecycle-bash.jsonl --series /bin/true=../docs/scaling/lifecycle-true.jsonl \
		--series "/bin/true, no disk"=../docs/scaling/lifecycle-true-nodisk.jsonl \
		--fleet "whole-inventory stamps"=../docs/scaling/fleet50-before.jsonl --fleet "stamp-only patches"=../docs/scaling/fleet50-after.jsonl \
		--fleet "16 shards"=../docs/scaling/fleet50-shards.jsonl --fleet "16 packed shards"=../docs/scaling/fleet50-packed.jsonl \
		--fleet "16 packed shards, again"=../docs/scaling/fleet50-packed-again.jsonl --fleet "changes in the inventory"=../docs/scaling/fleet50-changes.jsonl

.PHONY: bench-fleet
bench-fleet: kube-bins build ## Measure the control plane against FLEET_HOSTS (50) simulated hosts × FLEET_SANDBOXES (2000): etcd writes, CPU, memory, list, create and proxy times, a dead host's eviction; appends JSON lines to FLEET_OUT. Not in make test.
	cd e2e && go build -o $(BIN)/skiff-fleetsim ./cmd/skiff-fleetsim
	$(BIN)/skiff-fleetsim --bin $(BIN) --hosts $(FLEET_HOSTS) --sandboxes-per-host $(FLEET_SANDBOXES) --teams $(FLEET_TEAMS) \
		--interval $(FLEET_INTERVAL) --steady $(FLEET_STEADY) --churn $(FLEET_CHURN) --out $(FLEET_OUT) $(FLEET_FLAGS)

.PHONY: mutate
mutate: $(BIN)/gremlins ## Mutation testing of the freshness filter: every mutant must be killed.
	hack/mutate.sh

# The fleet lanes (e2e/fleet): two hosts in network namespaces, two
# sandbox-apiserver replicas behind the APIService, the envd proxy, and the
# control plane killed and cut under them. As root.
.PHONY: e2e
e2e: kube-bins build sdk-deps $(BIN)/helm ## The fleet lanes A-D with short windows (2 s interval, 6 s window) and the SDK suite through the fleet; in make test.
	cd e2e && go test -count=1 -timeout 30m -run '^TestLanes$$' -v ./fleet/

.PHONY: e2e-full
e2e-full: kube-bins build sdk-deps $(BIN)/helm ## The fleet lanes with the real defaults (30 s interval, 90 s window): about 25 minutes, not in make test.
	cd e2e && SKIFF_FLEET_INTERVAL=30s SKIFF_FLEET_WINDOW=90s go test -count=1 -timeout 90m -run '^TestLanes$$' -v ./fleet/

# The lanes against a kind cluster with the chart installed (hack/kind):
# for machines with a Docker daemon and Docker Hub, which these build
# machines have not; e2e/kind's suite takes a kubeconfig, so it runs against
# any cluster with the chart too.
.PHONY: e2e-kind
e2e-kind: image build sdk-deps $(BIN)/kind $(BIN)/helm ## The fleet lanes against a kind cluster with the chart (needs a Docker daemon and Docker Hub; as root; not in make test).
	BIN=$(BIN) IMAGE=$(IMAGE) hack/kind/e2e.sh

.PHONY: up-kube
up-kube: kube-bins build $(BIN)/helm ## Run the local fleet (as root) until Ctrl-C: prints the E2B_* lines and a KUBECONFIG for kubectl get sandboxes -A -w.
	cd e2e && go test -c -o $(BIN)/fleet.test ./fleet
	cd e2e/fleet && SKIFF_UP_KUBE=1 $(BIN)/fleet.test -test.run '^TestUpKube$$' -test.timeout 0 -test.v

UP_FLAGS ?=

.PHONY: up
up: build ## Run the whole system on this machine (as root) and print the E2B_* lines; Ctrl-C stops it (UP_FLAGS: skiff-up's flags).
	cd e2e && go build -o $(BIN)/skiff-up ./cmd/skiff-up
	$(BIN)/skiff-up --bin $(BIN) $(UP_FLAGS)
