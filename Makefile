# Two contracts: `make demo` (set up + run the pipeline on synthetic data) and `make test` (the full
# suite, what CI runs); `make test-quick` is the contributors' fast tier (tests not marked slow).
# The virtual environment is built once and reused; it is rebuilt when pyproject.toml or constraints.txt changes.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A CPU build of torch is taken when a local wheel of this version exists (pip's find-links);
# otherwise pip falls back to the registry's default build.
TORCH_PIN ?= torch==2.13.0
# Every other package at the release in constraints.txt (`make lock` writes it); empty: the newest allowed.
CONSTRAINTS ?= -c constraints.txt

.PHONY: demo test test-quick bench bench-gpu real-records install lock clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_PIN)" || $(PY) -m pip install --quiet torch
	$(PY) -m pip install --quiet -e ".[dev]" $(CONSTRAINTS)
	touch $(STAMP)

# constraints.txt: the releases in .venv, frozen after an install without the old constraints (so that a
# changed pyproject.toml's needs are met); torch and its CUDA runtime are left to TORCH_PIN
lock:
	rm -f $(STAMP)
	$(MAKE) install CONSTRAINTS=
	{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable \
	  | grep -vE '^(torch|torchvision|torchaudio|triton)==|^nvidia-'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

demo: $(STAMP)
	$(PY) -m pipelines demo --config demo

test: $(STAMP)
	@echo "make test: the full suite (what CI runs), about 9 minutes on 2 idle cores and longer on a busy machine;"
	@echo "make test-quick runs the fast tier (no end-to-end runs) in about 2 minutes"
	$(PY) -m pytest -q

# The fast tier: every test but those marked slow (end-to-end runs, subprocesses, notebooks, the docs site).
test-quick: $(STAMP)
	@echo "make test-quick: the tests not marked slow, about 2 minutes on 2 idle cores; make test runs them all"
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) -m benchmarks.run

# The same on a CUDA workstation: GNN fit, predict and throughput on the GPU next to the same machine's CPU.
bench-gpu: $(STAMP)
	BENCH_DEVICE=cpu,cuda BENCH_PRECISION=fp32,bf16 $(PY) -m benchmarks.run

# A run's ranking of the real TPU tuning records (../shared/real_tpu), next to the default-first baselines.
real-records: $(STAMP)
	$(PY) -m benchmarks.real_records --run $(RUN)

clean-venv:
	rm -rf $(VENV)
