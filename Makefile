# One entry point for set-up, serving and tests. `make serve` and `make test` are the Quickstart.
VENV ?= .venv
PY := $(VENV)/bin/python
BENTOML := $(VENV)/bin/bentoml
PORT ?= 3000

.PHONY: install demo-model serve test test-fast parity bench clean

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

clean:
	rm -rf $(VENV) build *.egg-info
