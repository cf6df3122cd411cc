#!/usr/bin/env bash
# make test's two pytest processes on the numeric paths of an AVX2-only machine, from an AVX-512 one (issue 30):
#
#   benchmarks/avx2_make_test.sh [OUT]     # default OUT: /tmp/avx2-make-test; logs OUT.first.log, OUT.vllm.log, OUT.meta
#   SLOWER=2 benchmarks/avx2_make_test.sh OUT   # also as on a host twice as slow (a busy loop beside each core)
#
# SLOWER=N keeps N-1 busy loops on every core (same priority) for the whole run, so each test process gets about
# 1/N of its core: the issue's AVX2 machine ran these halves 2.1x and 3.65x slower than this script's paths on an
# AMD EPYC, and a test with a wall-clock limit must pass there too. Its figures are not a timing, only a rehearsal.
# tests/avx2_paths.py sets numpy's, torch's, oneDNN's and MKL's switches and answers vLLM's ISA probes as an AVX2
# CPU's (so it loads _C_AVX2 and hardware.cpu_flags drops the AVX-512 flags); benchmarks/avx2_ggml.sh builds an
# AVX2-only libggml-cpu, put first on LD_LIBRARY_PATH for in-process llama.cpp. The peer tools get it too, through
# a copy of their directory holding that library: the launcher puts the tools' own directory first on a launched
# llama-server's LD_LIBRARY_PATH, so without the copy the server would run the native AVX-512 kernels while
# in-process llama.cpp runs AVX2 ones (their log-probs then differ: not what an AVX2 machine does).
# Measured on a 2-core Sapphire Rapids (2026-12-06, before the copy): first process 14:12, vLLM process 5:19.
# On a 2-core AMD EPYC with AVX-512 (2026-12-07, 799d712): first process 10:30, vLLM process 3:04. The issue's AVX2
# machine ran c4e8848's halves (no xdist) 2.1x and 3.65x slower than this script's paths on that AMD EPYC.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/avx2-make-test}
ggml=$(benchmarks/avx2_ggml.sh) || exit 2
peer=$(ls -d "$PWD"/.cache/peer/llama-cpp-python-*/build/bin 2>/dev/null | head -1)
[ -n "$peer" ] || { echo "avx2_make_test: no llama.cpp tools under .cache/peer (make peer builds them)" >&2; exit 2; }
bin=$(mktemp -d)
variants=$(mktemp -d)
burners=()
trap 'kill "${burners[@]}" 2>/dev/null; rm -rf "$bin" "$variants"' EXIT
for ((i = 1; i < ${SLOWER:-1}; i++)); do
  for core in $(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))'); do
    taskset -c "$core" bash -c 'trap "exit 0" TERM; while :; do :; done' & burners+=($!)
  done
done
cp -a "$peer"/. "$bin"/ && cp -a "$ggml"/libggml-cpu.so* "$bin"/
export CI=true LLAMA_CPP_BIN=$bin LD_LIBRARY_PATH=$ggml EVALKIT_TEST_VARIANTS=$variants
echo "SLOWER=${SLOWER:-1}: ${#burners[@]} busy loops" > "$out.meta"
for half in first vllm; do
  if [ "$half" = first ]; then mark="not vllm and not gpu"; else mark="vllm and not gpu"; fi
  start=$(date +%s)
  python3 tests/with_default_signals.py .venv/bin/python tests/avx2_paths.py -q -m "$mark" -n "${TEST_WORKERS:-2}" --dist loadgroup --durations=15 > "$out.$half.log" 2>&1
  rc=$?
  echo "$half rc $rc wall $(( $(date +%s) - start )) s: $(tail -1 "$out.$half.log")" | tee -a "$out.meta"
done
