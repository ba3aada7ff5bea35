# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The suite runs on two workers more than there are cores (pytest-xdist): a good part of its
# time is subprocesses, kills, ttl and network waits, which leave a core idle (on 2 cores:
# 8:44 with 2 workers, 6:01 with 3, 2026-12-04; 1,814 tests on 2026-12-07: 10:53 with 3 workers
# at ~1,640 tests, 9:14 with 4, the cores 96% busy and the last worker done 6 s after the
# others). Each worker has its own embedded S3 server. `make test PYTEST_WORKERS=` runs it in
# one process.
PYTEST_WORKERS ?= -n $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 2 ))) --dist worksteal

.PHONY: demo test lint typecheck bytecode bench bench-scale clean venv langgraph-demo workers-demo test-lgmin

# The oldest LangGraph that pyproject admits, in a second venv, for the LangGraph test files
# only: langgraph 1.0.1 is the first release that accepts langgraph-checkpoint 3.0.0. The
# stamp names the pins, so changing them rebuilds the venv (once, about a minute).
LGMIN := .venv-lgmin
LGMIN_PINS := langgraph==1.0.1 langgraph-checkpoint==3.0.0 langgraph-checkpoint-sqlite==3.0.0 \
	langgraph-checkpoint-conformance==0.0.2
LGMIN_STAMP := $(LGMIN)/.installed-lg1.0.1-cp3.0.0
# (DeltaChannel needs langgraph-checkpoint 4.1+, and the importer's tests need the
# newest savers' schemas: those run in .venv only; so do the thread-lease tests, ckptfs's own
# conditional writes whatever LangGraph is installed, and half a minute of ttl waits)
LG_TESTS := tests/test_langgraph_saver.py tests/test_langgraph_conformance.py \
	tests/test_langgraph_versions.py tests/test_lgcheck.py tests/test_lgformat.py

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH (set PY=python3 to override)"; exit 2; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,langgraph]'
	@touch $(STAMP)

venv: $(STAMP)

$(LGMIN_STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH (set PY=python3 to override)"; exit 2; }
	rm -rf $(LGMIN)
	$(PY) -m venv $(LGMIN)
	$(LGMIN)/bin/pip install --quiet --upgrade pip
	$(LGMIN)/bin/pip install --quiet -e '.[dev,langgraph]' $(LGMIN_PINS)
	$(LGMIN)/bin/python -c "import importlib.metadata as m; \
		assert m.version('langgraph') == '1.0.1' and m.version('langgraph-checkpoint') == '3.0.0'"
	@touch $(LGMIN_STAMP)

test-lgmin: $(LGMIN_STAMP)
	$(LGMIN)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_WORKERS) $(LG_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check ckptfs tests examples benchmarks backends

typecheck: $(STAMP)
	$(BIN)/mypy --strict ckptfs

# The suite's subprocesses (hundreds: the CLI, killed writers, examples) import ckptfs from
# bytecode compiled once here: where PYTHONDONTWRITEBYTECODE is set (this sandbox, many CI
# images) nothing else writes it, and each of them compiled ckptfs again: 0.5 s of CPU to import
# it against 0.3 s (2026-12-07, 2 cores).
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q ckptfs tests backends examples benchmarks

test: lint typecheck bytecode test-lgmin
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_WORKERS)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

bench: $(STAMP)
	$(BIN)/python benchmarks/commit_latency.py
	$(BIN)/python benchmarks/agent_overhead.py
	$(BIN)/python benchmarks/verify_throughput.py
	$(BIN)/python benchmarks/mirror_restore.py
	$(BIN)/python benchmarks/langgraph_put.py
	$(BIN)/python benchmarks/workers.py
	$(BIN)/python benchmarks/s3_load_artifacts.py
	$(BIN)/python benchmarks/group_commit.py
	$(BIN)/python benchmarks/seed_save_run.py
	$(BIN)/python benchmarks/cli_startup.py
	$(BIN)/python benchmarks/scale.py

# issue 12's table to 100,000 steps (about 15 minutes on 2 cores)
bench-scale: $(STAMP)
	$(BIN)/python benchmarks/scale.py --scale

langgraph-demo: $(STAMP)
	$(BIN)/python examples/langgraph_agent.py

workers-demo: $(STAMP)
	$(BIN)/python examples/workers.py

clean:
	rm -rf $(VENV) $(LGMIN) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
