# Quick start: `make demo` and `make test`. Both create .venv when it is missing and install into it.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_DATA := data/tiny

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

$(DEMO_DATA)/corpus.json: | $(STAMP)
	$(BIN)/chorus synth $(DEMO_DATA) --utterances 2000 --seed 0

# Synthesizes the tiny corpus (once), trains tiny.yaml with 2 gossip learners on a local Ray cluster
# started in-process (it prints the dashboard URL) and prints the summary JSON last.
demo: $(STAMP) $(DEMO_DATA)/corpus.json
	$(BIN)/chorus train jobs/configs/tiny.yaml --set learners=2 --set group.kind=gossip --out runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check orchestrator jobs search tests bench

bench: $(STAMP)
	$(BIN)/python bench/tiny_asr.py

clean:
	rm -rf runs data/tiny .pytest_cache
