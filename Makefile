# Two entry points: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo check test test-scale lint models bench clean gpu fleet

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,torch,ray,models,llama,executorch]'
	touch $(STAMP)

# reports/demo/ is the demo's own folder (ignored by git): --force replaces a demo an earlier
# xbackend wrote before it kept a ledger of its files
demo: $(STAMP)
	$(BIN)/xbackend compare models/torch_mlp.onnx --runs 3 --builds 2 \
		--backends ort-cpu,openvino-cpu,torch,reference,oracle --torch-module models/torch_mlp.py:build \
		--probes builds,threads,opt-levels \
		--report reports/demo/torch_mlp.md --json reports/demo/torch_mlp.json --force

# A GPU host's environment (docs/gpu.md): torch for CUDA 13, then onnxruntime-gpu's files
# over the CPU build's (the two share one import package).
gpu:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet 'torch==2.13.0' --index-url https://download.pytorch.org/whl/cu130
	$(BIN)/python -m pip install --quiet -e '.[dev,torch,ray,gpu]'
	$(BIN)/python -m pip uninstall --quiet -y onnxruntime
	$(BIN)/python -m pip install --quiet --force-reinstall --no-deps 'onnxruntime-gpu==1.31.1'
	touch $(STAMP)
	$(BIN)/xbackend backends

# The sample models over this machine's CPU engines: reports/zoo-fleet/fleet.md. --force: the
# committed report was written on another machine, whose sealed ledgers no clone can verify
fleet: $(STAMP)
	$(BIN)/xbackend sweep models/zoo.sweep.toml -o reports/zoo-fleet --force

# The unit tier, before every commit: logic on stored results and in-memory graphs (no engine)
check: $(STAMP)
	$(BIN)/python -m pytest -q -m unit

# The whole suite on three workers (most tests wait on engine processes part of the time, so three
# keep two cores busy), each test module on one worker so its module fixtures are built once; the
# 25 slowest tests printed, so a slow newcomer shows
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 3 --dist loadscope --durations=25

# A 2.25 GiB model through every path that builds or rewrites a model (a few minutes, ~10 GB of disk)
test-scale: $(STAMP)
	$(BIN)/python -m pytest -q -m scale

# names.py --max: the share of one-letter bindings stays under 10%; docstrings.py --max 1: every public
# function says what it takes and returns (docs/contributing.md)
lint: $(STAMP)
	$(BIN)/ruff check xbackend tests models benchmarks scripts
	$(BIN)/mypy
	$(BIN)/python scripts/names.py --max 10 --top 0
	$(BIN)/python scripts/docstrings.py --max 1 --top 0

models: $(STAMP)
	$(BIN)/python models/build.py

bench: $(STAMP)
	$(BIN)/python benchmarks/comparator.py
	$(BIN)/python benchmarks/vs_polygraphy.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
