# spmd: developer and CI entry points. Needs only Python (>= 3.10) and make:
# every target that needs packages creates .venv and installs them there
# (MPI included: PyPI's `mpich` wheel puts mpiexec in .venv/bin).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Ranks of the multi-process test suite.
NP ?= 4
# Per-test time limit (seconds), so a hang fails instead of blocking.
PYTEST_TIMEOUT ?= 300

.PHONY: venv demo test test-single test-mpi test-multinode bench bench-mpi bench-transformer bench-engine clean distclean

venv: $(VENV)/.stamp

# Re-runs only when pyproject.toml changes (or the venv is missing).
$(VENV)/.stamp: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,mpi,examples,checkpoint,compile]'
	touch $@

# The main job: a digit classifier trained with data and tensor parallelism on
# 4 MPI ranks (examples/train_mlp.py); plain mpiexec when spmd-run is missing.
demo: venv
	@if [ -x $(BIN)/spmd-run ]; then \
		echo "$(BIN)/spmd-run -n 4 examples/train_mlp.py"; \
		$(BIN)/spmd-run -n 4 examples/train_mlp.py; \
	else \
		echo "$(BIN)/mpiexec -n 4 $(BIN)/python examples/train_mlp.py"; \
		$(BIN)/mpiexec -n 4 $(BIN)/python examples/train_mlp.py; \
	fi

# The whole suite, one pytest command.  The multi-process tests (@pytest.mark.mpi,
# tests/mpi) run on $(NP) MPI ranks each through spmd.testing's pools of rank workers
# (tests/conftest.py, docs/testing.md); the collective, array and shared-memory ones
# a second time with the ranks on 2 simulated nodes (tests/mpi/conftest.py).  The
# multi-node tests (tests/multinode) run jobs on emulated nodes where namespaces can
# be made (root) and skip elsewhere, saying why.
# pytest's exit 5 (no test collected) fails the build: it would mean the suite
# vanished; SPMD_REQUIRE_MPI_TESTS=1 does the same for the multi-process tests.
test: venv
	@echo "=== the whole suite: pytest tests (multi-process tests on $(NP) MPI ranks; per-test $(PYTEST_TIMEOUT)s)"
	@SPMD_TEST_MPI_NP=$(NP) SPMD_REQUIRE_MPI_TESTS=1 \
		$(BIN)/python -m pytest -q -p no:cacheprovider --timeout=$(PYTEST_TIMEOUT) tests; \
	rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: the test suite collected no tests" >&2; fi; \
	exit $$rc

# The single-process tests alone.
test-single: venv
	@$(BIN)/python -m pytest -q -p no:cacheprovider --timeout=$(PYTEST_TIMEOUT) -m "not mpi" tests; \
	rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: the single-process test suite collected no tests" >&2; fi; \
	exit $$rc

# The multi-process tests the other way: in place on the ranks of an outer
# `mpiexec -n $(NP) ... pytest --with-mpi -m mpi` (pytest-mpi's style; .ci/pytest_mpi.sh,
# with per-test and whole-run time limits), then the collective, array and
# shared-memory tests again with the ranks on 2 simulated nodes.
test-mpi: venv
	NP=$(NP) PYTEST_TIMEOUT=$(PYTEST_TIMEOUT) SPMD_REQUIRE_MPI_TESTS=1 \
		bash .ci/pytest_mpi.sh tests/mpi tests/test_smoke_infra.py
	NP=$(NP) PYTEST_TIMEOUT=$(PYTEST_TIMEOUT) SPMD_REQUIRE_MPI_TESTS=1 SPMD_SIMULATE_NODES=2 \
		bash .ci/pytest_mpi.sh tests/mpi/test_mpi_collectives.py tests/mpi/test_mpi_arrays.py \
		tests/mpi/test_mpi_shm.py tests/mpi/test_mpi_p2p.py \
		--deselect tests/mpi/test_mpi_shm.py::test_mixed_blocking_and_started_calls_are_exact_under_skew

# The multi-node tests alone: jobs whose ranks are on emulated nodes (own host name
# and /dev/shm, MPI over the loopback; docs/testing.md, "Multi-node tests").  They
# need root to make namespaces; elsewhere each skips with the reason (-rs shows it).
test-multinode: venv
	@$(BIN)/python -m pytest -q -rs -p no:cacheprovider --timeout=$(PYTEST_TIMEOUT) tests/multinode; \
	rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "ERROR: the multi-node tests collected no tests" >&2; fi; \
	exit $$rc

bench: venv
	$(BIN)/python benchmarks/run.py

# Collectives and a data-parallel step against raw mpi4py, on 2 and on 4 ranks
# (results: benchmarks/results/mpi_n2.json, mpi_n4.json; see docs/performance.md).
bench-mpi: venv
	$(BIN)/mpiexec -n 2 $(BIN)/python benchmarks/bench_mpi.py
	$(BIN)/mpiexec -n 4 $(BIN)/python benchmarks/bench_mpi.py

# The transformer example on 1, 2 and 4 ranks (results: benchmarks/results/transformer.json).
bench-transformer: venv
	$(BIN)/python benchmarks/bench_transformer.py --steps 20

# The transformer step against JAX + optax and PyTorch in one process (issue 25;
# results: benchmarks/results/engine.json).  The floors live in their own venv,
# never in the project's: benchmarks only.
BENCH_VENV ?= .venv-bench
bench-engine: venv
	@test -x $(BENCH_VENV)/bin/python || python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -c "import jax, optax, torch" 2>/dev/null || \
		$(BENCH_VENV)/bin/pip install -q -e . jax optax 'torch==2.13.0'
	$(BENCH_VENV)/bin/python benchmarks/bench_engine.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(BENCH_VENV)
