# Two entry points: `make demo` and `make test`. Both build .venv from scratch when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck layers unit venv proto clean schema chromium prometheus docker controlplane helm monitoring-crds manifests test-kubernetes

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/tangram demo

lint: $(STAMP)
	$(BIN)/ruff check libs services tests
	$(BIN)/ruff format --check libs services tests

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP) chromium prometheus docker controlplane helm monitoring-crds
	$(BIN)/pytest -q --durations=40

# The web view's screenshot test drives headless Chromium (Debian's package). Installed once, as
# root with apt; nothing is done when it is already there.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The telemetry tests run a real Prometheus and promtool (Debian's package), installed the same way.
prometheus:
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || { \
		apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }

# The compose test runs `docker compose up --build` for real: Debian's Docker engine (docker.io) and
# mmdebstrap (the base image is made from Debian's packages, tests/compose/), installed once as
# root with apt, and Docker's compose plugin, which Debian does not package, built from its Go
# module once per version into ~/.cache/tangram/compose/ (or $$XDG_CACHE_HOME), like Helm.
docker: $(STAMP)
	@command -v dockerd >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1 || { \
		apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io mmdebstrap >/dev/null; }
	@$(BIN)/python -m tangram.local.docker build

# The Kubernetes control plane the tests run (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler in one Go program, tools/controlplane/), for the newest Kubernetes and the oldest
# Tangram supports. Built once per version and source into ~/.cache/tangram/controlplane/ (or
# $$XDG_CACHE_HOME); needs Go 1.26+ and the module proxy.
controlplane: $(STAMP)
	@$(BIN)/python -m tangram.local.controlplane build

# Helm, for the chart in deploy/helm/tangram: built from its Go module (helm.sh/helm/v3) once per
# version into ~/.cache/tangram/helm/ (or $$XDG_CACHE_HOME); needs Go and the module proxy.
helm: $(STAMP)
	@$(BIN)/python -m tangram.local.helm build

# The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, which the tests install into the
# control plane to validate the chart's objects: taken from its Go module
# (github.com/prometheus-operator/prometheus-operator) once per version into
# ~/.cache/tangram/prometheus-operator/ (or $$XDG_CACHE_HOME); needs Go and the module proxy.
monitoring-crds: $(STAMP)
	@$(BIN)/python -m tangram.local.monitoringcrds fetch

# deploy/kubernetes/*.yaml and deploy/openshift/node-scc.yaml are `helm template` output of the
# chart; edit the chart, then run this (the tests fail while the files differ from a fresh render).
manifests: helm
	$(BIN)/python -m tangram.local.helm manifests

# Only the tests that run against the real control plane (`make test` runs them too).
test-kubernetes: controlplane helm monitoring-crds
	$(BIN)/pytest -q -m controlplane

test: lint typecheck layers unit

# Regenerates the gRPC stubs of the kubelet plugin from the .proto files in the repository.
proto: $(STAMP)
	$(BIN)/python -m tangram.kubelet.codegen

schema: $(STAMP)
	$(BIN)/tangram schema > docs/events.asyncapi.json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
