# Quick start: `make demo` and `make test` (`make test-fast`: the unit tier only). They create .venv when it is
# missing and install into it.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_DATA := data/tiny

.PHONY: install demo test test-fast test-fuzz test-deps speech-deps lint bench gpu-check gpu-check-dry clean

# uv installs the ~6 GB in under half of pip's time (46 s against 106 s here, bytecode compiled by
# both), from the sources pip is configured with and choosing the same wheels (tools/pip_sources.py)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==0.13.9
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode --index-strategy unsafe-best-match \
	  $$($(BIN)/python tools/pip_sources.py $(VENV)/pip-sources) -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

$(DEMO_DATA)/corpus.json: | $(STAMP) speech-deps
	$(BIN)/chorus synth $(DEMO_DATA) --utterances 2000 --seed 0

# Synthesizes the tiny corpus (once), trains tiny.yaml with 2 gossip learners on a local Ray cluster
# started in-process (it prints the dashboard URL) and prints the summary JSON last.
demo: $(STAMP) $(DEMO_DATA)/corpus.json
	$(BIN)/chorus train jobs/configs/tiny.yaml --set learners=2 --set group.kind=gossip --out runs/demo \
	  $$(test -f $(DEMO_DATA)/test-unseen-engine.jsonl && echo --set data.test_unseen_engine=$(DEMO_DATA)/test-unseen-engine.jsonl)

# Debian's Festival and its English voices, the corpus's second speech engine (`chorus synth` makes an
# espeak-ng-only corpus without them, saying so), fortunes, the openvocab task's sentences, and flite,
# a third engine that speaks only when named (`chorus synth --engines espeak,festival,flite`)
FESTIVAL_PACKAGES := festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts
APT_INSTALL = SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo -n); ($$SUDO apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq
speech-deps:
	@test -d /usr/share/festival/voices/us/cmu_us_slt_arctic_hts || { $(APT_INSTALL) $(FESTIVAL_PACKAGES)) \
	    >/dev/null 2>&1 || echo "make: could not install Debian's Festival; corpora will be espeak-ng only"; }
	@test -d /usr/share/games/fortunes || { $(APT_INSTALL) fortunes) \
	    >/dev/null 2>&1 || echo "make: could not install Debian's fortunes; no openvocab corpus (chorus synth --task)"; }
	@command -v flite >/dev/null || { $(APT_INSTALL) flite) \
	    >/dev/null 2>&1 || echo "make: could not install Debian's flite; no corpus with --engines espeak,festival,flite"; }

# Debian's prometheus, for the test that runs the Grafana dashboard's queries, and Festival, for the
# synthesizer's tests of it (each test is skipped, saying why, when its package cannot be installed)
test-deps: speech-deps
	@command -v prometheus >/dev/null || { $(APT_INSTALL) prometheus) \
	    >/dev/null 2>&1 || echo "make: could not install Debian's prometheus; its test will be skipped"; }

# Python caches compiled bytecode by default; where the environment turns that off (PYTHONDONTWRITEBYTECODE=1,
# as on this project's machines), every process of a test run compiled the project's modules again and pytest
# rewrote every test module's asserts again: 35 of the unit tier's 150 CPU seconds. The test runs cache it
# (__pycache__ folders, which git ignores)
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE

# every tier: unit, ray and slow (pyproject.toml says what each holds), in two pytest-xdist workers,
# one per core, handed one test at a time, longest first (tests/conftest.py), naming the 15 slowest; the tests that share
# a module's fixtures (a Ray head, an S3 server) are an `xdist_group` that one worker runs whole
test: $(STAMP) test-deps
	$(TEST_ENV) $(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=15

# the unit tier only, for the edit loop: no Ray cluster, no Ray head; two workers, one per core (81-84 s here)
test-fast: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -m unit -n 2 --dist loadgroup

# the fuzz tests of every parser of outside input (tests/fuzz/) at nightly size: 5,000 fresh examples each (the
# unit tier draws a few hundred, from a fixed seed)
test-fuzz: $(STAMP)
	CHORUS_FUZZ_EXAMPLES=5000 $(TEST_ENV) $(BIN)/python -m pytest -q tests/fuzz -n 2

lint: $(STAMP)
	$(BIN)/ruff check orchestrator jobs search tests bench tools

bench: $(STAMP)
	$(BIN)/python bench/tiny_asr.py

# Chorus's GPU steps on one GPU, offline, in <= 420 s (tools/gpu_check/README.md); -dry: on this CPU (~5 min)
GPU_PY ?= python3
gpu-check:
	WHEELS=$(or $(WHEELS),.gpu/whl) PY=$(GPU_PY) bash tools/gpu_check/run.sh
gpu-check-dry: $(STAMP)
	DRY=1 PY=$(BIN)/python bash tools/gpu_check/run.sh

clean:
	rm -rf runs data/tiny .pytest_cache
