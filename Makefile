# `make render` and `make test` work on a fresh machine with Python 3.11+ and make: each sets up
# .venv (the virtualenv Pulumi.yaml names) from the pinned requirements first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SCAN_VENV := .venv-scan
SCAN_DIR := render/scan
STACK ?= dev
OUT ?= render/$(STACK)

.PHONY: gpu-node render test test-all e2e gpu-runtime-bin lint scan docs protos clean

# What rendering (and `pulumi up`) needs: requirements.txt only, so the first `make render` is quick.
$(VENV)/.runtime: requirements.txt constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "hidden-gpu needs Python 3.11 or newer")'
	@echo "make: setting up $(VENV) with what rendering needs (requirements.txt: about a minute the first time)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check --progress-bar off -r requirements.txt -c constraints.txt
	touch $@

# The tests' and linters' tools on top (requirements-dev.txt).
$(VENV)/.installed: $(VENV)/.runtime requirements-dev.txt requirements-host.txt
	@echo "make: adding the test and lint tools to $(VENV) (requirements-dev.txt: about two minutes the first time)"
	$(PY) -m pip install --disable-pip-version-check --progress-bar off -r requirements-dev.txt -c constraints.txt
	touch $@

$(SCAN_VENV)/.installed: requirements-scan.txt constraints-scan.txt
	$(PYTHON) -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-scan.txt -c constraints-scan.txt
	touch $@

render: $(VENV)/.runtime
	$(PY) -m offline.render --stack $(STACK) --out $(OUT)

test: $(VENV)/.installed
	$(PY) -m pytest -q -n auto

# The slow tests and every property test at its full example count (tests/support/examples.py).
test-all: $(VENV)/.installed
	HIDDEN_GPU_PROPERTIES=thorough $(PY) -m pytest -q -n auto -m 'not real'

# The real tier: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the Pulumi CLI and its
# Kubernetes provider, built from the Go modules pinned in e2e/go/ (cached by version), then tests/real
# against them on loopback; then the node tier (tests/node, as root): a real kubelet, containerd, runc and
# NVIDIA's runtime. Needs Go 1.26.6+ (e2e.build installs libseccomp-dev for runc where missing); docs/testing.md
# has the times.
e2e: $(VENV)/.installed
	$(PY) -m e2e.build
	$(PY) -m pytest -q -m real tests/real
	$(PY) -m pytest -q -m real tests/node

# The GPU host check's binaries (NVIDIA's container toolkit, runc), copied into lab/.gpu to carry to a
# GPU host: there, python3 lab/gpu_runtime_check.py --bin lab/.gpu --out DIR (docs/testing.md).
gpu-runtime-bin: $(VENV)/.installed
	$(PY) -m e2e.build --gpu-host
	mkdir -p lab/.gpu && cp -L e2e/.bin/runc e2e/.bin/nvidia-ctk e2e/.bin/nvidia-container-runtime e2e/.bin/nvidia-cdi-hook lab/.gpu/

# The GPU host run's carry (lab/.gpu/node: the node set xz-packed, the render, NVIDIA's plugin from ../shared/bin);
# then, on the GPU host: python3 -m lab.gpu_node_run run --out DIR (docs/testing.md, "The GPU host run").
gpu-node: $(VENV)/.installed
	$(PY) -m lab.gpu_node_run prepare

# docs/configuration.md is generated from the config models; make test fails when it is stale.
docs: $(VENV)/.installed
	$(PY) -m offline.config_reference
	$(PY) -m offline.package_schema

# The kubelet PodResources stubs, generated from our own .proto; make test fails when they are stale.
protos: $(VENV)/.installed
	$(PY) -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. --pyi_out=. host/podresources/api.proto

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml

# Render every stack (and the golden stack that declares every component), then scan the manifests. Deliberate
# exceptions are skipped in the manifests themselves (checkov.io/skipN annotations), each with its reason.
scan: $(VENV)/.installed $(SCAN_VENV)/.installed
	rm -rf $(SCAN_DIR)
	for stack_file in stacks/Pulumi.*.yaml; do \
		stack=$${stack_file#stacks/Pulumi.}; stack=$${stack%.yaml}; \
		$(PY) -m offline.render --stack $$stack --out $(SCAN_DIR)/$$stack || exit 1; \
	done
	$(PY) -m offline.render --stack-file tests/golden/Pulumi.every.yaml --out $(SCAN_DIR)/every
	BC_SKIP_MAPPING=TRUE $(SCAN_VENV)/bin/checkov --directory $(SCAN_DIR) --framework kubernetes --compact --quiet

clean:
	rm -rf $(VENV) $(SCAN_VENV) render .pytest_cache .mypy_cache .ruff_cache
