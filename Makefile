# One entry point for set-up, serving and tests. `make serve` and `make test` are the Quickstart.
VENV ?= .venv
PY := $(VENV)/bin/python
BENTOML := $(VENV)/bin/bentoml
PORT ?= 3000

.PHONY: install demo-model serve test test-fast parity bench audit soak clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m services.grpc_codegen
	touch $@

install: $(VENV)/.installed

# A generated demo graph + a trained model in the BentoML model store, unless one is there.
demo-model: install
	@$(BENTOML) models get graphsage:latest >/dev/null 2>&1 || $(PY) -m training_export demo

serve: demo-model
	$(BENTOML) serve services.gateway:Gateway --port $(PORT)

test: install
	$(PY) -m pytest tests

test-fast: install
	$(PY) -m pytest tests -m "not integration"

parity: install
	$(PY) -m training_export parity

# Vulnerability audit of the installed packages; needs the PyPI JSON API or api.osv.dev.
audit: install
	$(PY) -m pip install -q pip-audit
	$(VENV)/bin/pip-audit --progress-spinner off --skip-editable

# 10 minutes of steady load: errors, P99 drift, memory growth (docs/reliability.md).
soak: install
	$(PY) bench/soak.py --minutes 10

clean:
	rm -rf $(VENV) build *.egg-info

# --- Release (docs/release.md) -------------------------------------------------------------
# make bento [MODELS="graphsage:v1 graphsage:v2"]   codegen + pinned models + bentoml build
# make bento-context [BENTO=tag]                     OCI build context in build/context
# make containerize [BENTO=tag]                      bentoml containerize, or the context
# make split-up / split-status / split-down          the bento's services as separate processes
# make validate-k8s                                  bentos/k8s/*.yaml against the k8s schema
BENTO ?= graphsage-serving:latest
MODELS ?=
K8S_MANIFESTS := $(filter-out %/kustomization.yaml,$(wildcard bentos/k8s/*.yaml bentos/k8s/*/*.yaml))

.PHONY: bento bento-gpu bento-context containerize split-up split-status split-down validate-k8s test-release

bento: install
	$(PY) -m bentos.release build $(foreach m,$(MODELS),--model $(m))

bento-gpu: install
	$(PY) -m bentos.release build --gpu $(foreach m,$(MODELS),--model $(m))

bento-context: install
	$(PY) -m bentos.release context $(BENTO) --out build/context --force

containerize: install
	$(PY) -m bentos.release containerize $(BENTO)

split-up: install
	$(PY) -m bentos.local_split up --bento $(BENTO) --gateway-port $(PORT)

split-status:
	$(PY) -m bentos.local_split status

split-down:
	$(PY) -m bentos.local_split down

validate-k8s: install
	@$(PY) -c "import kubernetes_validate" 2>/dev/null || $(PY) -m pip install -q -e '.[release]'
	$(VENV)/bin/kubernetes-validate --strict $(K8S_MANIFESTS)

test-release: install
	$(PY) -m pytest tests/test_release.py
