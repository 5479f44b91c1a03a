# Two entry points: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint models bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,torch]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/xbackend compare models/torch_mlp.onnx --runs 3 --builds 2 \
		--backends ort-cpu,openvino-cpu,torch,reference,oracle --torch-module models/torch_mlp.py:build \
		--probes builds,threads,opt-levels \
		--report reports/torch_mlp.md --json reports/torch_mlp.json

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check xbackend tests models benchmarks
	$(BIN)/mypy

models: $(STAMP)
	$(BIN)/python models/build.py

bench: $(STAMP)
	$(BIN)/python benchmarks/comparator.py
	$(BIN)/python benchmarks/vs_polygraphy.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
