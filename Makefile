# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean venv langgraph-demo workers-demo

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH (set PY=python3 to override)"; exit 2; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,langgraph]'
	@touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check ckptfs tests examples benchmarks backends

typecheck: $(STAMP)
	$(BIN)/mypy --strict ckptfs

test: lint typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider

demo: $(STAMP)
	$(BIN)/python examples/demo.py

bench: $(STAMP)
	$(BIN)/python benchmarks/commit_latency.py
	$(BIN)/python benchmarks/agent_overhead.py
	$(BIN)/python benchmarks/verify_throughput.py
	$(BIN)/python benchmarks/mirror_restore.py
	$(BIN)/python benchmarks/langgraph_put.py
	$(BIN)/python benchmarks/workers.py

langgraph-demo: $(STAMP)
	$(BIN)/python examples/langgraph_agent.py

workers-demo: $(STAMP)
	$(BIN)/python examples/workers.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
