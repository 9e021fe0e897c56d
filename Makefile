# The two set-up commands of the README. Both create .venv in the repo root on a fresh machine.
# TensorFlow is pinned to what Vertex AI's newest prebuilt training image carries (2.17, Keras 3).
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

demo: $(VENV)/.installed-bench
	rm -rf $(JOB_DIR)
	$(VENV)/bin/python -m trainer.task --job_dir=$(JOB_DIR)

# Locally the slow tests are skipped; CI (which sets CI=true) runs the full suite.
PYTEST_MARKS := $(if $(CI),,-m "not slow")

# Style (ruff) and types (mypy, settings in pyproject.toml) first: a regression fails fast.
test: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m pytest $(PYTEST_MARKS) tests

test-all: $(VENV)/.installed-test
	$(VENV)/bin/python -m pytest tests

clean:
	rm -rf $(VENV) runs build dist *.egg-info
