# The two set-up commands of the README. Both create .venv in the repo root on a fresh machine.
# TensorFlow is pinned to 2.17 (Keras 3), which the trainer's images (deploy/container, on
# tensorflow/tensorflow:2.17.0) and Vertex AI's last prebuilt training image carry.
PYTHON ?= python3
VENV := .venv
TF_PIN := tensorflow-cpu==2.17.1
JOB_DIR ?= runs/demo

.PHONY: demo test test-all clean

$(VENV)/.installed-%: setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet "$(TF_PIN)" -e ".[$*]"
	touch $@

# The BigQuery emulator of the bq:// tests (tests/bigquery_emulator.py), in an environment of
# its own: it needs cryptography>=46.0.7, mitmproxy (the gs:// tests) <44.1, and protobuf 6,
# TensorFlow 2.17 <5. DuckDB is pinned to the version whose spatial extension PyPI ships.
BQEMULATOR := $(VENV)/bqemulator
$(BQEMULATOR)/.installed: Makefile
	$(PYTHON) -m venv $(BQEMULATOR)
	$(BQEMULATOR)/bin/pip install --quiet --upgrade pip
	$(BQEMULATOR)/bin/pip install --quiet "bqemulator==1.4.0" "duckdb==1.5.5" \
		"duckdb-extension-spatial==1.5.5" numpy
	touch $@

demo: $(VENV)/.installed-bench
	rm -rf $(JOB_DIR)
	$(VENV)/bin/python -m trainer.task --job_dir=$(JOB_DIR)

# Locally the slow tests are skipped; CI (which sets CI=true) runs the full suite. Tests run in
# several processes (pytest-xdist), each taking the next test as it finishes one: two per core
# (at most 8) for the default run, whose tests often wait on subprocesses, servers and timeouts;
# one per core for the full run, whose clusters of up to 7 processes need the cores they wait on.
PYTEST_MARKS := $(if $(CI),,-m "not slow")
PYTEST_XDIST := -n $(if $(CI),auto,$(shell n=$$(( $$(nproc) * 2 )); echo $$(( n > 8 ? 8 : n )))) \
	--dist worksteal

# Style (ruff), types (mypy) and the architecture's layers (import-linter; all three set in
# pyproject.toml) first: a regression fails fast.
test: $(VENV)/.installed-test $(BQEMULATOR)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m pytest $(PYTEST_XDIST) $(PYTEST_MARKS) tests

test-all: $(VENV)/.installed-test $(BQEMULATOR)/.installed
	$(VENV)/bin/python -m pytest -n auto --dist worksteal tests

clean:
	rm -rf $(VENV) runs build dist *.egg-info
