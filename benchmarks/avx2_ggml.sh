#!/usr/bin/env bash
# An AVX2-only llama.cpp CPU backend for measuring the AVX2 kind of machine from an AVX-512 one (issue 30).
#
#   benchmarks/avx2_ggml.sh [DIR]          # default DIR: .cache/avx2-ggml; prints the directory to put first on LD_LIBRARY_PATH
#
# Only libggml-cpu is compiled (~40 s on 2 cores), from the sources `make install` built the venv's libraries from,
# with the ISA fixed at AVX2+FMA+F16C+BMI2 instead of -march=native (no AVX-512, no AMX). The build's libraries carry
# RUNPATH $ORIGIN, which LD_LIBRARY_PATH precedes, so with DIR first there the venv's libllama and the peer tools
# (llama-perplexity, llama-server) all load this libggml-cpu.so.0: llama.cpp's system_info (engines/<dep>.json)
# then reads "AVX2 = 1" without "AVX512". benchmarks/bench_default_run.py --avx2 uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
ver=$(sed -n 's/.*llama-cpp-python==\([0-9.]*\).*/\1/p' pyproject.toml)
src=.cache/peer/llama-cpp-python-$ver/src/vendor/llama.cpp
out=${1:-.cache/avx2-ggml}
[ -d "$src" ] || { echo "avx2_ggml: no llama.cpp sources at $src (make install unpacks them)" >&2; exit 2; }
if [ ! -e "$out/libggml-cpu.so.0" ]; then
  cmake -S "$src" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_OPENSSL=OFF >/dev/null
  nice cmake --build "$out/build" --target ggml-cpu -j "$(nproc)" >/dev/null
  cp -P "$out"/build/bin/libggml-cpu.so* "$out"/
fi
cd "$out" && pwd
