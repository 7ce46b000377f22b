# One entry point for set-up, serving and tests. `make serve` and `make test` are the Quickstart.
VENV ?= .venv
PY := $(VENV)/bin/python
BENTOML := $(VENV)/bin/bentoml
PORT ?= 3000

.PHONY: install demo-model serve serve-colocated test test-fast lint parity bench audit soak clean

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

# The three services in one process (the co-located deployment: lowest latency on one machine;
# docs/release.md): the gateway started alone runs the runners in its own worker.
serve-colocated: demo-model
	$(PY) -m bentoml_cli._internal.start start-http-server services.gateway:Gateway --service-name Gateway \
	  --host 127.0.0.1 --port $(PORT)

test: install
	$(PY) -m pytest tests

test-fast: install
	$(PY) -m pytest tests -m "not integration"

# ruff (lint and format check) and mypy (strict on common/ and the cores: pyproject.toml): zero findings.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

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
# make base-image                                    the local Debian base (no registry needed)
# make image [MODELS=...] [IMAGE=...]                the release image: bento + bentoml containerize
# make image-torch [TORCH_INDEX_URL=URL|TORCH_WHEELS=DIR]  the same with torch (training, torch backend)
# make image-gpu                                     the GPU image (its CUDA base from a registry)
# make test-image                                    the image's three containers end to end
BENTO ?= graphsage-serving:latest
MODELS ?=
K8S_MANIFESTS := $(filter-out %/kustomization.yaml,$(wildcard bentos/k8s/*.yaml bentos/k8s/*/*.yaml))
# The names the Kubernetes manifests use (bentos/k8s/*.yaml; kustomize sets the registry).
IMAGE ?= graphsage-serving:release
TORCH_IMAGE ?= graphsage-serving-torch:release
GPU_IMAGE ?= graphsage-serving-gpu:release
# docker.base_image of the CPU images: the local Debian base (make base-image) where no registry
# is reachable; BASE_IMAGE= (empty) builds on BentoML's own python:3.11-slim instead.
BASE_IMAGE ?= localhost/graphsage-base:bookworm
# auto: docker where its daemon answers, else buildah, else podman.
IMAGE_BACKEND ?= auto
# image-torch: PyTorch's CPU wheel index (an extra index for the build), or a directory with
# the CPU wheel where no such index is reachable; with neither, the index pip is configured with.
TORCH_INDEX_URL ?=
TORCH_WHEELS ?=

.PHONY: bento bento-gpu bento-context containerize split-up split-status split-down validate-k8s test-release
.PHONY: base-image image image-torch image-gpu test-image

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

base-image:
	@case "$(BASE_IMAGE)" in \
	  localhost/*) bash bentos/base_image.sh "$(BASE_IMAGE)" ;; \
	  "") echo "no base image: BentoML's python:3.11-slim, pulled by the build" ;; \
	  *) echo "base image $(BASE_IMAGE): pulled from its registry by the build" ;; \
	esac

# The bento (models pinned from $$BENTOML_HOME, the demo one unless MODELS says), then BentoML's
# containerize; tagged $(IMAGE) and with the bento's own tag.
image: demo-model base-image
	@set -e; tag=$$($(PY) -m bentos.release build $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE)) \
	  $(foreach m,$(MODELS),--model $(m))); \
	$(PY) -m bentos.release image "$$tag" -t $(IMAGE) -t "$$tag" --backend $(IMAGE_BACKEND)

image-torch: demo-model base-image
	@set -e; tag=$$($(PY) -m bentos.release build --torch $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE)) \
	  $(if $(TORCH_INDEX_URL),--extra-index $(TORCH_INDEX_URL)) $(foreach m,$(MODELS),--model $(m))); \
	$(PY) -m bentos.release image "$$tag" -t $(TORCH_IMAGE) -t "$$tag" --backend $(IMAGE_BACKEND) \
	  $(if $(TORCH_WHEELS),--find-links $(TORCH_WHEELS))

image-gpu: demo-model
	@set -e; tag=$$($(PY) -m bentos.release build --gpu $(foreach m,$(MODELS),--model $(m))); \
	$(PY) -m bentos.release image "$$tag" -t $(GPU_IMAGE) -t "$$tag" --backend $(IMAGE_BACKEND)

test-image: install
	GRAPHSAGE_TEST_IMAGE=$(IMAGE) $(PY) -m pytest tests/test_image.py
