# pgtrain: `make demo` trains and commits a model end to end; `make test` runs the whole suite.
# Both install what is missing first (a project-local .venv; Horovod is built once into a cached wheel).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WHEEL_CACHE ?= $(HOME)/.cache/pgtrain/wheels
STAMP := $(VENV)/.installed

.PHONY: install demo test lint mpi image-tools image-cpu image-gpu bench bench-quick load-digits load-slid load-computers render-mpijob stop-db clean ui stop-ui browser test-stack

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt trainer_image/requirements.txt trainer_image/build_horovod.sh pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip wheel setuptools
	# torch first, alone and at its pin: the CPU wheel, never a multi-GB CUDA build pulled in by a range
	$(PY) -m pip install -q -c constraints.txt torch
	# pgtrain editable with its dev extra, at the tested versions; its entry points register the Airflow plugins
	$(PY) -m pip install -q --no-build-isolation -c constraints.txt -r requirements-dev.txt
	# Horovod: built from its sdist against that torch (PyPI has no wheel); its dependencies came with the extras
	$(PY) -m pip install -q --no-deps "$$(bash trainer_image/build_horovod.sh $(PY) $(WHEEL_CACHE) | tail -n1)"
	$(VENV)/bin/horovodrun --check-build | grep -q '\[X\] PyTorch'
	touch $(STAMP)

demo: install
	bash scripts/demo.sh

test: install browser image-tools mpi
	bash scripts/test.sh

lint: install
	$(VENV)/bin/ruff check .

bench: install  # full size: 500k-row loader against its peers, 2M-row manifest (several minutes)
	$(PY) -m pip install -q -r benchmarks/requirements.txt  # the loader's peers (its C-level floor needs psql), bench_quality's references
	$(PY) benchmarks/run_all.py

bench-quick: install  # the same benchmarks on small tables, to check they run
	$(PY) -m pip install -q -r benchmarks/requirements.txt
	PGTRAIN_BENCH_ROWS=20000 PGTRAIN_BENCH_MANIFEST_ROWS=100000 PGTRAIN_BENCH_STORE_MB=64 \
		PGTRAIN_BENCH_TRAIN_ROWS=20000 PGTRAIN_BENCH_TRAIN_ROUNDS=1 PGTRAIN_BENCH_DAG_ROUNDS=1 \
		PGTRAIN_BENCH_MEMORY_ROWS=50000,200000 PGTRAIN_BENCH_GPU_ROWS=50000 PGTRAIN_BENCH_GPU_ROUNDS=1 \
		PGTRAIN_BENCH_QUALITY_TABLES=iris,slid,diabetes PGTRAIN_BENCH_QUALITY_TABM_D_BLOCK=64 \
		PGTRAIN_BENCH_QUALITY_NETWORK_SECONDS=60 \
		PGTRAIN_BENCH_RESULTS=benchmarks/out/results.json \
		$(PY) benchmarks/run_all.py

load-digits: install
	$(PY) -m dev.examples digits --if-empty

load-slid: install  # R's car::SLID into public.slid (text categories, NULLs): the slid-sex model's data
	$(PY) -m dev.examples slid --if-empty

load-computers: install  # R's Ecdat::Computers into public.computers ("yes"/"no" text columns)
	$(PY) -m dev.examples computers --if-empty

render-mpijob: install
	$(PY) -m pgtrain.launch.mpijob.cli render --world-size 8 --gpus-per-worker 4 --image pgtrain-trainer:latest --run-id example

ui: install  # a local Airflow on http://127.0.0.1:8080 (api-server, scheduler, dag-processor, triggerer); see README
	# SLID into its training database ($$PGTRAIN_DATABASE_URL, else .pgdata/'s pgtrain) if empty: slid-sex's data
	url="$${PGTRAIN_DATABASE_URL:-$$($(PY) -m dev.devdb url .pgdata)}" && \
		PGTRAIN_DATABASE_URL="$$url" $(PY) -m dev.examples slid --if-empty
	$(PY) -m dev.devstack start

stop-ui:  # stop what `make ui` started (the embedded PostgreSQL keeps running: make stop-db)
	test ! -x $(PY) || $(PY) -m dev.devstack stop

browser:  # Debian's Chromium and chromedriver, for the browser test only (tests/integration/stack/test_models_page.py); apt-get, as root
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  $(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq chromium chromium-driver >/dev/null; }

mpi:  # Debian's Open MPI mpirun (no headers: the local Horovod stays Gloo) and nss_wrapper, for the simulated cluster's torch-backend test; apt-get, as root
	command -v mpirun >/dev/null && /sbin/ldconfig -p | grep -q libnss_wrapper || { \
	  $(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq openmpi-bin libnss-wrapper >/dev/null; }

image-tools:  # Debian's buildah and mmdebstrap: build the trainer image without a daemon or a registry; apt-get, as root
	command -v buildah >/dev/null && command -v mmdebstrap >/dev/null || { \
	  $(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq buildah mmdebstrap >/dev/null; }

image-cpu: install image-tools  # the trainer image's CPU variant as localhost/pgtrain-trainer:cpu in ~/.cache/pgtrain/buildah
	bash trainer_image/build_cpu_image.sh $(PY)

# The GPU variant as localhost/pgtrain-trainer:gpu (trainer_image/Dockerfile.gpu), no GPU needed; for drivers older
# than R580: make image-gpu TORCH_VARIANT=cu126 TORCH_INDEX=https://download.pytorch.org/whl/cu126
TORCH_VARIANT ?= cu130
TORCH_INDEX ?=
image-gpu: image-tools
	bash trainer_image/build_gpu_image.sh $(TORCH_VARIANT) $(TORCH_INDEX)

test-stack: install browser  # only the tests that start the real Airflow stack (REST API, models page in Chromium)
	bash scripts/test.sh -m stack

stop-db:  # stop the demo's embedded PostgreSQL (its data stays in .pgdata/)
	test ! -d .pgdata || $(PY) -m dev.devdb stop .pgdata

clean: stop-ui stop-db
	rm -rf .airflow .airflow-ui .demo .pytest_cache test-artifacts
