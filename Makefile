# Two commands matter: `make demo` (the main job) and `make test` (the whole
# suite on TF 1.15 *and* TF 2.15). Each creates the virtual environment it needs.
SHELL := /bin/bash

# TF 1.15 needs Python 3.7; TF 2.15 runs on Python 3.11. The first candidate
# (pyenv's installs, then PATH) that really runs as that version is used: a
# pyenv shim on PATH may exist without the version being selected.
find_python = $(shell for p in $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$(1).*/bin/python 2>/dev/null | sort -t. -k3 -n -r) $$(command -v python$(1) 2>/dev/null); do \
  "$$p" -c 'import sys; sys.exit(sys.version_info[:2] != ($(subst .,$(comma),$(1))))' >/dev/null 2>&1 && { echo "$$p"; break; }; done)
comma := ,
PYTHON37 ?= $(call find_python,3.7)
PYTHON311 ?= $(call find_python,3.11)

VENV_TF1 := .venv/tf1
VENV_TF2 := .venv/tf2
PYTEST_ARGS ?= -q -p no:cacheprovider
V1_BEHAVIOR_TESTS := tests/towers/test_model_suite.py tests/towers/test_copy_fidelity.py tests/towers/test_optimizer_fidelity.py tests/graph_copy/test_copied_functions.py tests/towers/test_eval_fidelity.py tests/towers/test_uneven_batches.py tests/towers/test_misuse_errors.py tests/towers/test_empty_tower_write_edges.py tests/towers/test_optimizer_hyperparameters.py tests/towers/test_variables_made_anew.py

.PHONY: demo test test-tf1 test-tf2 test-tf2-v1 lint bench bench-tf2 bench-scale bench-gpu-graph sdist venv-tf1 venv-tf2 clean

demo: $(VENV_TF1)/.installed
	$(VENV_TF1)/bin/python examples/digits_demo.py $(DEMO_ARGS)

# Lints, then runs both suites even when something fails; fails if any did.
test: $(VENV_TF1)/.installed $(VENV_TF2)/.installed
	@rc=0; \
	echo "=== lint (ruff) ==="; \
	$(VENV_TF2)/bin/ruff check . || rc=1; \
	echo "=== TF 1.15 (Python 3.7) ==="; \
	$(VENV_TF1)/bin/python -m pytest tests $(PYTEST_ARGS) || rc=1; \
	echo "=== TF 2.15 (Python 3.11) ==="; \
	$(VENV_TF2)/bin/python -m pytest tests $(PYTEST_ARGS) || rc=1; \
	echo "=== TF 2.15 after disable_v2_behavior(): the fidelity suites ==="; \
	REPLICATE_TEST_V1_BEHAVIOR=1 $(VENV_TF2)/bin/python -m pytest $(V1_BEHAVIOR_TESTS) $(PYTEST_ARGS) || rc=1; \
	if [ $$rc -ne 0 ]; then echo "FAILED: lint or at least one TensorFlow suite failed"; fi; \
	exit $$rc

# pyflakes and import order (ruff.toml); tests/test_architecture.py checks
# the layering.
lint: $(VENV_TF2)/.installed
	$(VENV_TF2)/bin/ruff check .

test-tf1: $(VENV_TF1)/.installed
	$(VENV_TF1)/bin/python -m pytest tests $(PYTEST_ARGS)

test-tf2: $(VENV_TF2)/.installed
	$(VENV_TF2)/bin/python -m pytest tests $(PYTEST_ARGS)

# TF1 code on TF 2.15 usually runs after disable_v2_behavior() (TF1 control
# flow): the suites that compare copied towers with one device run that way
# too.
test-tf2-v1: $(VENV_TF2)/.installed
	REPLICATE_TEST_V1_BEHAVIOR=1 $(VENV_TF2)/bin/python -m pytest $(V1_BEHAVIOR_TESTS) $(PYTEST_ARGS)

bench: $(VENV_TF1)/.installed
	$(VENV_TF1)/bin/python benchmarks/run_all.py $(BENCH_ARGS)

# The same benchmark on TF 2.15 (run_all.py --python; no contrib rows there),
# written to benchmarks/results/tf2 so that the TF 1.15 report stays.
bench-tf2: $(VENV_TF2)/.installed
	$(VENV_TF2)/bin/python benchmarks/run_all.py --out-dir benchmarks/results/tf2 $(BENCH_ARGS)

# 1-32 towers against one device (issue 26); SCALE_ARGS=--quick for a smoke
# run. TF 2.15 rows: add `--python $(VENV_TF2)/bin/python --append`.
bench-scale: $(VENV_TF1)/.installed
	$(VENV_TF1)/bin/python benchmarks/scale_bench.py $(SCALE_ARGS)

# GPU towers graph only (issue 34): TF 1.15, then TF 2.15's section beside
# it; GPU_GRAPH_ARGS='--models resnet50 --towers 1,8,16 --rounds 1' for less.
bench-gpu-graph: $(VENV_TF1)/.installed $(VENV_TF2)/.installed
	$(VENV_TF1)/bin/python benchmarks/gpu_graph_bench.py $(GPU_GRAPH_ARGS)
	$(VENV_TF1)/bin/python benchmarks/gpu_graph_bench.py --python $(VENV_TF2)/bin/python --append $(GPU_GRAPH_ARGS)

venv-tf1: $(VENV_TF1)/.installed
venv-tf2: $(VENV_TF2)/.installed

$(VENV_TF1)/.installed: setup.py
	@test -n "$(PYTHON37)" || { echo "Python 3.7 not found: install it (e.g. 'pyenv install 3.7') or pass PYTHON37=/path/to/python3.7"; exit 1; }
	$(PYTHON37) -m venv $(VENV_TF1)
	$(VENV_TF1)/bin/python -m pip install -q --upgrade 'pip<24.1' 'setuptools<68' wheel
	$(VENV_TF1)/bin/python -m pip install -q -e '.[tf,test,demo,bench]'
	touch $@

$(VENV_TF2)/.installed: setup.py
	@test -n "$(PYTHON311)" || { echo "Python 3.11 not found: install it (e.g. 'pyenv install 3.11') or pass PYTHON311=/path/to/python3.11"; exit 1; }
	$(PYTHON311) -m venv $(VENV_TF2)
	$(VENV_TF2)/bin/python -m pip install -q --upgrade pip setuptools wheel
	$(VENV_TF2)/bin/python -m pip install -q -e '.[tf2,test,demo,lint]'
	touch $@

# The source distribution (tf-replicate) in dist/, then the check of its
# file list and metadata (tests/test_packaging.py).
sdist: $(VENV_TF2)/.installed
	$(VENV_TF2)/bin/python setup.py -q sdist --dist-dir dist
	$(VENV_TF2)/bin/python -m pytest tests/test_packaging.py $(PYTEST_ARGS)

clean:
	rm -rf .venv build dist *.egg-info
