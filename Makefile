# The README's commands. Each target installs what it needs first (system packages, venv).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT ?= runs/latest

.PHONY: install emulate test bench bench-netem lint clean

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install-system-deps
	./scripts/install-system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

emulate: install
	$(BIN)/pddemu emulate --system all --out $(OUT)

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m pddemu.bench --out bench/results

bench-netem: install
	$(BIN)/netem bench --out bench/results/netem.json

lint: install
	$(BIN)/ruff check netem pddemu tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
