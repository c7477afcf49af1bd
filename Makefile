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
# vLLM's benchmark client (`vllm bench serve`), in a venv of its own. vLLM's own requirements
# would pull a CUDA torch of several GB: vLLM is installed without them, with the CPU torch the
# project uses and only the modules its CLI imports (with vLLM's version bounds); xgrammar and
# llguidance without theirs (their triton is not needed to benchmark a server).
VLLM_VERSION := 0.33.0
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-$(VLLM_VERSION)
VLLM_CLIENT_DEPS := torch==2.13.0 numpy packaging regex pyyaml tqdm psutil cachetools \
  'huggingface_hub>=1.31.0' 'transformers>=5.16.1,<5.21.0' 'pydantic>=2.12.0' \
  'requests>=2.33.0' 'aiohttp>=3.14.4' 'openai>=2.25.0' openai-harmony 'pyzmq>=25.0.0' \
  urllib3 cbor2 msgspec cloudpickle 'pillow>=13.0.0' pybase64 uvloop py-cpuinfo \
  'fastapi>=0.133.0,<0.137.0' uvicorn 'prometheus_client>=0.18.0' partial-json-parser \
  watchfiles 'orjson>=3.11.6' einops 'apache-tvm-ffi==0.1.11'

.PHONY: install aiperf vllm-client emulate test bench bench-netem bench-faults bench-vllm \
  bench-reproduce lint docs reproduce clean

install: $(STAMP)

aiperf: $(AIPERF_STAMP)

$(AIPERF_STAMP):
	test -x $(AIPERF_VENV)/bin/python || $(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install -q aiperf==$(AIPERF_VERSION)
	touch $(AIPERF_STAMP)

vllm-client: $(VLLM_STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	echo torch==2.13.0 > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/python -m pip install -q -c $(VLLM_VENV)/constraints.txt $(VLLM_CLIENT_DEPS)
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps vllm==$(VLLM_VERSION) xgrammar==0.2.8 \
	  'llguidance>=1.7.0,<1.8.0'
	$(VLLM_VENV)/bin/vllm bench serve --help > /dev/null
	touch $(VLLM_STAMP)

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

# Every benchmark module, reproduce_quick (every experiment's quick variant, about 25 of its
# minutes) among them. Not vllm-client: a failed vLLM install must not stop the other
# benchmarks (vllm_serve then reports its venv missing); `make bench-vllm` installs it.
bench: install aiperf
	$(BIN)/python -m pddemu.bench --out bench/results

# vLLM's `vllm bench serve` against `pddemu serve` (bench/results/vllm_serve.json)
bench-vllm: install vllm-client
	$(BIN)/python -m pddemu.bench --only vllm_serve --out bench/results

# Every experiment's quick variant as one sweep job each, its wall time, points, valid points
# and mean speed-up in bench/results/reproduce_quick.json (about 25 min on 2 cores, docs/sweep.md's
# "Quick variants"): what `make bench` runs among the others, alone;
# EXPERIMENTS="kv-transfer handoff" runs some of them.
bench-reproduce: install
	$(BIN)/python -m pddemu.bench --only reproduce_quick --experiments $(EXPERIMENTS) \
	  --out bench/results

bench-faults: install
	$(BIN)/python -m pddemu.bench --only faults --out bench/results

bench-netem: install
	$(BIN)/netem bench --out bench/results/netem.json

# The paper's experiments (experiments/*.toml), then docs/validation.md's reproduction section
# from their results, whose sweep.json, sweep.csv and search.json are kept in docs/reproduction/
# (quick variants) and docs/reproduction/full/ (full ones): the report sets them side by side.
# QUICK=1: the quick variants (docs/validation.md gives each one's wall time).
# An experiment whose points fail does not stop the others; the report says what is missing.
EXPERIMENTS ?= $(basename $(notdir $(wildcard experiments/*.toml)))
REPRODUCE_OUT ?= runs/reproduce$(if $(QUICK),-quick)
REPRODUCE_DOCS = docs/reproduction$(if $(QUICK),,/full)
reproduce: install
	status=0; for name in $(EXPERIMENTS); do \
	  $(BIN)/pddemu sweep --experiment experiments/$$name.toml $(if $(QUICK),--quick) \
	    --out $(REPRODUCE_OUT)/$$name || status=1; \
	done; \
	(cd $(REPRODUCE_OUT) && find . -path '*/points' -prune -o \( -name sweep.json -o -name \
	  sweep.csv -o -name search.json \) -exec install -D -m 644 {} $(CURDIR)/$(REPRODUCE_DOCS)/{} \;); \
	$(BIN)/pddemu sweep report docs/reproduction docs/reproduction/full --out docs/validation.md; \
	exit $$status

lint: install
	$(BIN)/ruff check netem pddemu tests

docs: install  # the pages generated from code
	$(BIN)/pddemu config docs --out docs/config.md

clean:
	rm -rf $(VENV) $(AIPERF_VENV) $(VLLM_VENV) *.egg-info .pytest_cache
