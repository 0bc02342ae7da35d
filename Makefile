# make answer: create .venv, install the package with the tpu extra (libtpu: compiles for TPU topologies on this
# machine) and jax's CUDA plugin (off sys.path, in .venv/cuda-aot: mesh.devices loads it to compile for GPUs), so
# every README example runs; print the 4D answers.
# make test: also the dev extra, ruff, then the quick tier on two workers (pytest-xdist): every test that compiles
# nothing, and of those that compile (markers tpu, compiles, numerics, grid, processes) the ones marked quick, the
# smallest compiled comparison of each closed-form term (tests/test_tiers.py); then the timing tests alone.
# make test-all: every test; the notebooks last, reading the check grids' reports the first pass left in one cache.
# make pictures: redraw the README's picture, docs/predict-llama2-7b-h100.png (predict --plot).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: answer test test-all pictures clean

$(VENV)/.base: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[tpu]"
	$(PY) -m pip install -q -c constraints.txt --no-deps --target $(VENV)/cuda-aot jax-cuda12-plugin jax-cuda12-pjrt
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,tpu]"
	$(PY) -m ipykernel install --sys-prefix --name python3 > /dev/null
	touch $@

answer: $(VENV)/.base
	$(VENV)/bin/jax-scaling answer

# the README's predict example, drawn (jax_scaling.plots.draw_predict)
pictures: $(VENV)/.base
	$(VENV)/bin/jax-scaling predict --preset llama2-7b --chip H100 --chips 64 --mesh data=8,fsdp=8 --global-batch 256 \
		--plot docs/predict-llama2-7b-h100.png > /dev/null

QUICK := quick or not (tpu or compiles or numerics or grid or processes)

test: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "($(QUICK)) and not timing" --durations=15
	$(PY) -m pytest -q -p no:xdist -m "timing and ($(QUICK))"

test-all: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	cache=$$(mktemp -d) && export VERIFY_CHECK_CACHE=$$cache && \
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not timing" --ignore=tests/test_notebooks.py --durations=25 && \
	$(PY) -m pytest -q -n 2 tests/test_notebooks.py && \
	$(PY) -m pytest -q -p no:xdist -m timing

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
