# Two entry points: `make demo` and `make test`. Both build .venv from scratch when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck layers unit venv proto clean schema controlplane

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

unit: $(STAMP) controlplane
	$(BIN)/pytest -q

# The Kubernetes control plane the tests run (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler in one Go program, tests/controlplane/). Built once per Kubernetes version and
# source into ~/.cache/tangram/controlplane/ (or $$XDG_CACHE_HOME); needs Go and the module proxy.
controlplane: $(STAMP)
	@$(BIN)/python -m tangram.kube.controlplane build

test: lint typecheck layers unit

# Regenerates the gRPC stubs of the kubelet plugin from the .proto files in the repository.
proto: $(STAMP)
	$(BIN)/python -m tangram.kubelet.codegen

schema: $(STAMP)
	$(BIN)/tangram schema > docs/events.asyncapi.json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
