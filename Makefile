# The README's commands. Each target installs what it needs first (system packages, venv).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RAY_STAMP := $(VENV)/.installed-ray
OUT ?= runs/latest
# AIPerf, the benchmark client the serve tests drive, in a venv of its own (its dependencies
# must not touch the project's torch). Pinned: its export layout is what pddemu export writes.
AIPERF_VERSION := 0.13.0
AIPERF_VENV := .venv-aiperf
AIPERF_STAMP := $(AIPERF_VENV)/.installed-$(AIPERF_VERSION)

.PHONY: install aiperf emulate test bench bench-netem bench-faults lint docs reproduce clean

install: $(STAMP)

aiperf: $(AIPERF_STAMP)

$(AIPERF_STAMP):
	test -x $(AIPERF_VENV)/bin/python || $(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install -q aiperf==$(AIPERF_VERSION)
	touch $(AIPERF_STAMP)

$(STAMP): pyproject.toml scripts/install-system-deps
	./scripts/install-system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

emulate: install
	$(BIN)/pddemu emulate --system all --out $(OUT)

# The tests run sweeps on a local Ray cluster too: the `ray` extra.
$(RAY_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,ray]'
	touch $(RAY_STAMP)

test: install aiperf $(RAY_STAMP)
	$(BIN)/python -m pytest

bench: install aiperf
	$(BIN)/python -m pddemu.bench --out bench/results

bench-faults: install
	$(BIN)/python -m pddemu.bench --only faults --out bench/results

bench-netem: install
	$(BIN)/netem bench --out bench/results/netem.json

# The paper's experiments (experiments/*.toml), then docs/validation.md's reproduction section
# from their results, whose sweep.json, sweep.csv and search.json are kept in docs/reproduction/.
# QUICK=1: the quick variants (docs/validation.md gives each one's wall time).
# An experiment whose points fail does not stop the others; the report says what is missing.
EXPERIMENTS ?= $(basename $(notdir $(wildcard experiments/*.toml)))
REPRODUCE_OUT ?= runs/reproduce$(if $(QUICK),-quick)
reproduce: install
	status=0; for name in $(EXPERIMENTS); do \
	  $(BIN)/pddemu sweep --experiment experiments/$$name.toml $(if $(QUICK),--quick) \
	    --out $(REPRODUCE_OUT)/$$name || status=1; \
	done; \
	(cd $(REPRODUCE_OUT) && find . -path '*/points' -prune -o \( -name sweep.json -o -name \
	  sweep.csv -o -name search.json \) -exec install -D -m 644 {} $(CURDIR)/docs/reproduction/{} \;); \
	$(BIN)/pddemu sweep report docs/reproduction --out docs/validation.md; exit $$status

lint: install
	$(BIN)/ruff check netem pddemu tests

docs: install  # the pages generated from code
	$(BIN)/pddemu config docs --out docs/config.md

clean:
	rm -rf $(VENV) $(AIPERF_VENV) *.egg-info .pytest_cache
