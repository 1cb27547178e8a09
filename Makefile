# Fault-tolerant LLM training on EKS: one Makefile for setup, synthesis, tests, the demo and benchmarks.
# Every target installs what it needs (into .venv, node_modules and .tools) on a fresh machine.

PYTHON      ?= python3.11
VENV        := .venv
PY          := $(VENV)/bin/python
HELM        := .tools/bin/helm
# checkov (the policy scan, tests/infra/test_policy.py) lives in a virtual environment of its own: its
# dependencies pin versions the project's .venv pins differently. The stamp names the version, so a new pin
# reinstalls it.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV    := .tools/checkov
CHECKOV_STAMP   := $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION)
CDK         := node_modules/.bin/cdk
TEAMS       ?= teams.yaml
NAMESPACE   ?= ml-research
PYTEST_ARGS ?=
# make test runs two pytest workers (xdist); tests/groups.py groups the tests so that most multi-process
# training runs go one after another on one worker while the other takes a second lane of them first,
# then the rest. --no-loadscope-reorder: the groups start in tests/groups.py's order. make test-fast runs
# three: its tests wait (on a control plane, a subprocess, a timeout) a quarter of the time, which two
# workers left idle on 2 cores; three lost with make test's training runs (docs/testing.md).
PYTEST_WORKERS ?= 2
FAST_WORKERS ?= 3
XDIST       = -n $(1) --dist loadgroup --no-loadscope-reorder
# The NVRx release the image ships (Dockerfile NVRX_VERSION); installed by tools/install_nvrx.py.
NVRX_VERSION := 0.7.0
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export MPLBACKEND := Agg

.DEFAULT_GOAL := help
.PHONY: help setup controlplane test-deps prometheus synth test test-fast soak lint chart-gen demo demo-cluster demo-compare demo-straggler bench bench-quick smoke-render cluster-smoke clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml tools/install_nvrx.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[infra,trainer,cluster,report,test,dev,examples]'
	$(PY) tools/install_nvrx.py --version $(NVRX_VERSION)
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(HELM): $(VENV)/.installed tools/install_helm.py
	$(PY) tools/install_helm.py --dest .tools/bin

$(CHECKOV_STAMP):
	rm -rf $(CHECKOV_VENV)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check checkov==$(CHECKOV_VERSION)
	touch $@

setup: $(VENV)/.installed node_modules/.installed $(HELM) $(CHECKOV_STAMP) ## Install Python deps, the CDK CLI, helm and checkov (idempotent)

# The real control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd) built from the
# wrapper Go module controlplane/ with the Go toolchain; tools/controlplane starts it. Cold build on 2
# cores: about 4 min and 2.7 GB of Go build cache; a rebuild from the cache takes seconds.
CONTROLPLANE_BIN := .tools/controlplane/bin
CONTROLPLANE_PKGS := k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler ./cmd/etcd
# Kubernetes' own build stamps the version into the binaries; without it the API server reports
# v0.0.0-master and helm refuses the chart's kubeVersion constraint. Read from the pinned go.mod.
KUBE_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" { print $$2; exit }' controlplane/go.mod)
KUBE_MINOR := $(word 2,$(subst ., ,$(KUBE_VERSION)))
KUBE_STAMP := $(foreach pkg,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
  -X $(pkg).gitVersion=$(KUBE_VERSION) -X $(pkg).gitMajor=1 -X $(pkg).gitMinor=$(KUBE_MINOR) \
  -X $(pkg).gitTreeState=clean)

$(CONTROLPLANE_BIN)/.built: controlplane/go.mod controlplane/go.sum $(wildcard controlplane/cmd/*/*.go) Makefile
	@command -v go >/dev/null || { echo "make controlplane: the Go toolchain (go) is not on PATH"; exit 2; }
	mkdir -p $(CONTROLPLANE_BIN)
	cd controlplane && go build -trimpath -ldflags='-s -w $(KUBE_STAMP)' -o $(abspath $(CONTROLPLANE_BIN))/ $(CONTROLPLANE_PKGS)
	touch $@

# The PodMonitor CRD the chart's podMonitor.enabled renders for (a Prometheus team's trainer release):
# kube-prometheus-stack installs it on EKS. Taken from prometheus-operator's source module, the newest
# release the module proxy serves here; the tests install it on the local API server.
PROMETHEUS_OPERATOR := github.com/prometheus-operator/prometheus-operator@v0.85.0
PODMONITOR_CRD := .tools/controlplane/crds/podmonitors.yaml

$(PODMONITOR_CRD): Makefile
	@command -v go >/dev/null || { echo "make controlplane: the Go toolchain (go) is not on PATH"; exit 2; }
	mkdir -p $(dir $@)
	dir=$$(cd $${TMPDIR:-/tmp} && go mod download -json $(PROMETHEUS_OPERATOR) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p') && \
	  cp "$$dir/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" $@ && chmod 644 $@

controlplane: $(CONTROLPLANE_BIN)/.built $(PODMONITOR_CRD) ## Build the local Kubernetes control plane into .tools/controlplane/bin

synth: setup ## Synthesize one CloudFormation template per team of $(TEAMS) into cdk.out/
	@# Validate first: a bad teams file ends here with exit 2 and its one-line error, not the CDK CLI's own line.
	@$(PY) -m infra.teams $(TEAMS) > /dev/null
	$(CDK) synth --quiet -c teams_file=$(TEAMS) > /dev/null
	@ls cdk.out/*.template.json

# The metrics test scrapes a real run with a real Prometheus server (Debian's package); skipped when on PATH.
prometheus: ## Install Debian's prometheus if it is not on PATH (apt-get; sudo when not root)
	@command -v prometheus >/dev/null || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus; }

# BLUEPRINT_REQUIRE_TOOLS=1: a test that needs helm or the CDK CLI fails (never skips) when it is missing.
# What the tests need, installed side by side: the venv, checkov's venv and the control plane's Go build
# are independent, and one after another they were 3.4 minutes of a fresh clone's make test.
test-deps:
	@$(MAKE) --no-print-directory --output-sync=target -j3 setup controlplane

test: test-deps prometheus ## Run the whole test suite
	BLUEPRINT_REQUIRE_TOOLS=1 $(PY) -m pytest $(call XDIST,$(PYTEST_WORKERS)) $(PYTEST_ARGS)

test-fast: test-deps ## Run the tests that need no multi-process training
# A -m here replaces pyproject's -m 'not soak' (pytest keeps the last): it names soak itself.
	BLUEPRINT_REQUIRE_TOOLS=1 $(PY) -m pytest $(call XDIST,$(FAST_WORKERS)) -m 'not slow and not soak' $(PYTEST_ARGS)

soak: setup prometheus ## The long runs kept out of make test: every checkpoint mode, more fault mixes
	BLUEPRINT_REQUIRE_TOOLS=1 $(PY) -m pytest -m soak $(PYTEST_ARGS)

lint: setup ## ruff, mypy, and the chart's generated parts up to date
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy infra trainer goodput
	$(PY) -m tools.chartgen --check

chart-gen: ## Regenerate the chart's trainer options, their schema entries and defaults from the settings
	$(PY) -m tools.chartgen

demo: setup ## Synthesize the default team, render the chart, run a faulted 2x2-rank smoke run on CPU (on the real control plane once it is built), report
	@# Built once (make controlplane, make test): kept up to date, then used; never built by the demo itself
	@if [ -f $(CONTROLPLANE_BIN)/.built ]; then $(MAKE) --no-print-directory controlplane; fi
	$(PY) -m tools.demo_cluster --teams $(TEAMS) --stand-in-unless-built

demo-cluster: setup controlplane ## The demo's run as a Job of the installed chart on a real control plane (tools/controlplane) and a process kubelet
	$(PY) -m tools.demo_cluster --teams $(TEAMS)

demo-compare: setup controlplane ## The stand-in demo and the real-control-plane demo in one run, their figures side by side
	$(PY) -m tools.demo_cluster --teams $(TEAMS) --compare

demo-straggler: setup ## The demo with a straggler, three runs side by side: fault-free, evicted into the hot spare, only reported (~4 min)
	$(PY) -m tools.demo_straggler --teams $(TEAMS)

bench: setup ## Benchmarks: recovery, node loss, checkpoint stall, snapshots, synth, scale, planner (~55 min on 2 cores); results in bench/results/
	$(PY) -m bench

bench-quick: setup ## A short benchmark pass (under 10 min): fewer scenarios and sizes, one repetition
	$(PY) -m bench --quick

smoke-render: setup ## Render the cluster smoke release's manifests (no cluster needed) to out/smoke/manifests.yaml
	@mkdir -p out/smoke
	$(PY) -m tools.cluster_smoke --render-only > out/smoke/manifests.yaml
	@echo "wrote out/smoke/manifests.yaml"

cluster-smoke: setup ## Faulted smoke run on a deployed environment (kubeconfig set): make cluster-smoke NAMESPACE=<team>
	$(PY) -m tools.cluster_smoke --namespace $(NAMESPACE)

clean: ## Remove build outputs (keeps .venv, node_modules, .tools)
	rm -rf cdk.out out
