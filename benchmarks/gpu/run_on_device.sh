#!/usr/bin/env bash
# Runs on the device machine (the `device` tool's run), from the root of the checkout it sends, with the pack
# (benchmarks/gpu/pack.sh) carried as .gpu/. Work lives in .cache/gpu-work/ (ignored, kept while the machine stays
# warm); what comes back is written under $OUT. Steps (each fits one call of at most 10 minutes):
#   build   llama.cpp with CUDA (sm_90): libllama + llama-bench + llama-quantize, once (a carried
#           .gpu/llama-cuda.tar.xz from an earlier call is unpacked instead); SmolLM2-shaped models; the gpu
#           tests; llama-bench on Q4_K_M and Q8_0
#   run     the evalkit GPU run (benchmarks/gpu/h200.yaml): hf bf16, hf fp8, llama.cpp Q4_K_M and Q8_0; then
#           llama-bench and benchmarks/bench_decode.py (evalkit's decode vs tg128) on both GGUFs
#   qwen    Qwen2.5-7B-shaped bf16 + Q4_K_M: plan vs NVML peak (benchmarks/gpu/h200-qwen.yaml)
#   decode  the hf engine's decode speed (benchmarks/bench_hf_decode.py: c1/c16, compiled vs graphs only, kernels
#           per step) and its GPU decode tests; needs only the SmolLM2-shaped hf checkpoint (no llama.cpp build)
#   llama-decode  llama.cpp: the load-order check and bench_decode.py on both GGUFs (~1 minute once built)
#   all     build, run, then Qwen bf16 and the gpu tests as far as the call's 10 minutes allow
# Every step first makes sure the earlier steps' outputs exist (a cold machine rebuilds what it needs).
set -uo pipefail
STEP=${1:?usage: run_on_device.sh build|run|qwen|decode|llama-decode|all}
ROOT=$PWD
PACK=$ROOT/.gpu
# Under .cache/ (ignored by the repo's .gitignore): the device keeps ignored outputs between warm calls and
# removes untracked ones that the sent tree lacks (a .gpu-work/ ignored only in .git/info/exclude lost its files).
W=$ROOT/.cache/gpu-work
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
NPROC=$(nproc)
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

# evalkit (fresh every call: the pack's tree), the wheels, llama-cpp-python's Python package
rm -rf "$W/evalkit" && mkdir -p "$W/evalkit" && tar -xf "$PACK/evalkit.tar" -C "$W/evalkit"
if [ ! -f "$W/site/.done" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" "$PACK"/whl/*.whl && touch "$W/site/.done"
fi
if [ ! -d "$W/src" ]; then mkdir -p "$W/src" && tar -xJf "$PACK/llama-src.tar.xz" -C "$W/src"; fi
LLVER=$(sed -n 's/.*llama-cpp-python==\([0-9.]*\).*/\1/p' "$W/evalkit/pyproject.toml")
mkdir -p "$W/py" && rm -rf "$W/py/llama_cpp" && cp -r "$W/src/llama_cpp" "$W/py/"
mkdir -p "$W/py/llama_cpp_python-$LLVER.dist-info" "$W/py/evalkit-0.1.0.dist-info"
printf 'Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: %s\n' "$LLVER" > "$W/py/llama_cpp_python-$LLVER.dist-info/METADATA"
printf 'Metadata-Version: 2.1\nName: evalkit\nVersion: 0.1.0\n' > "$W/py/evalkit-0.1.0.dist-info/METADATA"
export PYTHONPATH=$W/evalkit:$W/py:$W/site
export LLAMA_CPP_LIB_PATH=$W/build/bin LLAMA_CPP_BIN=$W/build/bin EVALKIT_CACHE_DIR=$W/cache
BIN=$W/build/bin
M=$W/models
CONVERT="$PY $W/evalkit/benchmarks/gpu/convert.py $W/src/vendor/llama.cpp --"

build_llama() {
  [ -x "$BIN/llama-bench" ] && return 0
  # A build brought back by an earlier call (split in parts of < 16 MiB, the most one returned file may be),
  # carried in .gpu/: unpacked in seconds instead of built in minutes.
  if ls "$PACK"/llama-cuda.tar.xz.part-* >/dev/null 2>&1; then
    say "unpacking the carried CUDA build"; mkdir -p "$BIN" && cat "$PACK"/llama-cuda.tar.xz.part-* | tar -xJ -C "$BIN" && return 0
  fi
  # Flash-attention kernels are not compiled (GGML_CUDA_FA=OFF: ~100 of the ~120 template files): evalkit's
  # llama.cpp deployments run with flash_attn off (its default "auto" resolves to off where the CUDA backend lacks
  # FLASH_ATTN_EXT; the engine info's flash_attn says so) and llama-bench with -fa 0.
  say "building llama.cpp with CUDA (sm_90) on $NPROC cores"
  cmake -S "$W/src/vendor/llama.cpp" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=on \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DGGML_CUDA_FA=OFF > "$W/cmake.log" 2>&1 || { tail -30 "$W/cmake.log"; exit 3; }
  cmake --build "$W/build" --target llama llama-bench llama-quantize -j "$NPROC" > "$W/build.log" 2>&1 || { tail -40 "$W/build.log"; exit 3; }
  say "built"
  # Bring the build back (about 43 MB as .tar.xz, in parts under 16 MiB) for later calls to carry (pack.sh's DEST).
  if [ -n "${RETURN_BUILD:-}" ]; then
    (cd "$BIN" && tar -cf - --exclude='*.a' . | xz -T0 -6 | split -b 15M - "$OUT/llama-cuda.tar.xz.part-") && ls -la "$OUT" && say "build packed"
  fi
}

smollm_hf() {
  [ -f "$M/smollm2-hf/config.json" ] && return 0
  say "SmolLM2-135M-shaped random weights (hf, bf16)"
  $PY "$W/evalkit/benchmarks/gpu/make_model.py" "$PACK/models/smollm2" "$PACK/models/smollm2" "$M/smollm2-hf" || exit 4
}

smollm_models() {
  [ -f "$M/smollm2-Q8_0.gguf" ] && [ -f "$M/smollm2-Q4_K_M.gguf" ] && return 0
  say "GGUF bf16, Q8_0, Q4_K_M of the SmolLM2-shaped weights"
  smollm_hf
  $CONVERT "$M/smollm2-hf" --outtype bf16 --outfile "$M/smollm2-bf16.gguf" > "$W/convert.log" 2>&1 || { tail -20 "$W/convert.log"; exit 4; }
  for q in Q8_0 Q4_K_M; do "$BIN/llama-quantize" "$M/smollm2-bf16.gguf" "$M/smollm2-$q.gguf" $q "$NPROC" > "$W/quantize-$q.log" 2>&1 || { tail "$W/quantize-$q.log"; exit 4; }; done
  ls -la "$M"
}

gpu_tests() {
  say "gpu tests"
  (cd "$W/evalkit" && EVALKIT_GPU_HF=$M/smollm2-hf EVALKIT_GPU_GGUF=$M/smollm2-Q4_K_M.gguf timeout ${1:-240} $PY -X faulthandler -m pytest -v -s \
     -p no:cacheprovider -m gpu tests/test_gpu.py > "$OUT/gpu-tests.log" 2>&1; grep -E "PASSED|FAILED|ERROR|passed|failed|NVML|KLD|^E " "$OUT/gpu-tests.log" | head -30)
}

smollm_run() {
  say "evalkit run benchmarks/gpu/h200.yaml"
  (cd "$W/evalkit" && sed "s#@MODELS@#$M#g" "${EVALKIT_GPU_CONFIG:-benchmarks/gpu/h200.yaml}" > "$W/h200.yaml" && $PY -m evalkit plan "$W/h200.yaml" > "$OUT/plan.txt" 2>&1; tail -20 "$OUT/plan.txt"
   $PY -m evalkit run --config "$W/h200.yaml" --out "$W/reports" --no-cache 2>&1 | grep -v "it/s\]\|s/it\]" | tail -40)
  RUN=$(ls -d "$W"/reports/*/ | tail -1)
  # The llama.cpp load crash seen here on 2026-12-02 (a GGUF load segfaulting right after "init_tokenizer" in a
  # worker that imported evalkit before llama_cpp: libllama's std::regex calls bound to another library's copy)
  # is fixed in the engine (load_llama_cpp: libstdc++ into the global scope first). A deployment left unfinished says the fix did not
  # hold; LLAMA_PRELOAD_FALLBACK=1 resumes it with llama_cpp preloaded (sitecustomize), the old workaround.
  unfinished=0
  for f in "$RUN"/records/*.jsonl; do [ -s "$f" ] || unfinished=1; done
  if [ "$unfinished" = 1 ]; then
    say "UNFINISHED deployments in $RUN (see its logs/): $(for f in "$RUN"/records/*.jsonl; do [ -s "$f" ] || basename "$f" .jsonl; done | tr '\n' ' ')"
    if [ "${LLAMA_PRELOAD_FALLBACK:-0}" = 1 ]; then
      say "resuming them with llama_cpp preloaded (LLAMA_PRELOAD_FALLBACK=1)"
      mkdir -p "$W/preload" && echo "import llama_cpp  # loaded before evalkit's imports" > "$W/preload/sitecustomize.py"
      (cd "$W/evalkit" && PYTHONPATH=$W/preload:$PYTHONPATH $PY -m evalkit run --resume "$RUN" 2>&1 | grep -v "it/s\]\|s/it\]" | tail -8
       $PY -m evalkit report "$RUN" 2>&1 | tail -2)
    fi
  fi
  cp "$RUN/report.md" "$OUT/" 2>/dev/null  # scores.csv and the rest are in run.tar.gz (8 files come back at most)
  tar -C "$RUN" -czf "$OUT/run.tar.gz" --exclude='distributions' --exclude='*.png' . && ls -la "$OUT"
  say "llama-bench on the same GGUFs, same call"
  "$BIN/llama-bench" -m "$M/smollm2-Q4_K_M.gguf" -m "$M/smollm2-Q8_0.gguf" -ngl 99 -fa 0 -p 128 -n 128 -r 5 -o md 2>&1 | tee "$OUT/llama-bench.md" | tail -6
  [ -n "${SKIP_DECODE:-}" ] || decode_bench  # SKIP_DECODE=1: the same call ran `llama-decode` first
}

# Issue 21's done-when: evalkit's llama.cpp decode at concurrency 1 >= 0.95x llama-bench tg128, same GGUF, same
# call (benchmarks/bench_decode.py: llama-bench, raw low-level loops, Llama.generate, evalkit; per-token overhead).
decode_bench() {
  say "decode: evalkit vs llama-bench tg128 (benchmarks/bench_decode.py)"
  rm -f "$OUT/decode.txt"  # one file for both (at most 8 files come back from a call)
  for q in Q4_K_M Q8_0; do
    (cd "$W/evalkit" && $PY benchmarks/bench_decode.py --model "$M/smollm2-$q.gguf" --llama-bench "$BIN/llama-bench" --ngl -1 --rounds 3) 2>&1 | tee -a "$OUT/decode.txt" | tail -12
  done
}

# The load order that crashed here: torch (CUDA) imported first, then evalkit's llama.cpp engine loads a GGUF.
load_order_check() {
  say "llama.cpp load after torch (the 2026-12-02 crash)"
  (cd "$W/evalkit" && timeout 120 $PY -X faulthandler -c "
import sys, torch; torch.zeros(1, device='cuda')
from evalkit.engines.base import GenRequest, SamplingParams
from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions
e = LlamaCppEngine('$M/smollm2-Q4_K_M.gguf', LlamaCppOptions(n_ctx=512, n_gpu_layers=-1))
r = list(e.generate([GenRequest('a', 'Hello', chat=False, max_tokens=8, ignore_eos=True)], SamplingParams(max_tokens=8)))[0]
print('load-order check OK: torch first, GGUF loaded on', e.info().extra['offload'], r.output_token_ids)" 2>&1 | tail -15)
}

# Qwen2.5-7B-shaped: bf16 on hf always; Q4_K_M (convert + quantize, minutes) only with `with_q4`.
qwen_run() {
  if [ ! -d "$M/qwen7b-hf" ]; then
    say "Qwen2.5-7B-shaped random weights (bf16, 15 GB)"
    $PY "$W/evalkit/benchmarks/gpu/make_model.py" "$PACK/models/qwen2.5-7b" "$PACK/models/smollm2" "$M/qwen7b-hf" || return 4
  fi
  CFG=benchmarks/gpu/h200-qwen-bf16.yaml
  if [ "${1:-}" = with_q4 ]; then
    if [ ! -f "$M/qwen7b-Q4_K_M.gguf" ]; then
      say "Qwen GGUF bf16, Q4_K_M"
      $CONVERT "$M/qwen7b-hf" --outtype bf16 --outfile "$M/qwen7b-bf16.gguf" > "$W/convert-qwen.log" 2>&1 || { tail -20 "$W/convert-qwen.log"; return 4; }
      "$BIN/llama-quantize" "$M/qwen7b-bf16.gguf" "$M/qwen7b-Q4_K_M.gguf" Q4_K_M "$NPROC" > "$W/quantize-qwen.log" 2>&1 || { tail "$W/quantize-qwen.log"; return 4; }
      rm -f "$M/qwen7b-bf16.gguf"
    fi
    CFG=benchmarks/gpu/h200-qwen.yaml
  fi
  say "evalkit plan + cost run $CFG"
  (cd "$W/evalkit" && sed "s#@MODELS@#$M#g" $CFG > "$W/qwen.yaml" && $PY -m evalkit plan "$W/qwen.yaml" --json > "$OUT/plan-qwen.json" 2>&1; $PY -m evalkit plan "$W/qwen.yaml" 2>&1 | tail -8
   $PY -m evalkit run --config "$W/qwen.yaml" --out "$W/reports-qwen" --no-cache 2>&1 | grep -v "it/s\]\|s/it\]" | tail -25)
  RUN=$(ls -d "$W"/reports-qwen/*/ | tail -1)
  tar -C "$RUN" -czf "$OUT/run-qwen.tar.gz" --exclude='distributions' --exclude='*.png' . && ls -la "$OUT"
}

elapsed() { echo $(( $(date +%s) - t0 )); }

# The hf engine's decode: tokens/s at c1 and c16, device vs host time per step, compiled vs graphs only (the engine
# as issue 21's first H200 run had it), GPU kernels per step; then the hf GPU tests (compiled decode numerics).
hf_decode() {
  say "bench_hf_decode"
  (cd "$W/evalkit" && timeout ${1:-330} $PY benchmarks/bench_hf_decode.py --model "$M/smollm2-hf" --device cuda \
     --concurrency 1,16 --variants compiled,graphs --kernels 2>&1 | grep -v "it/s\]" | tee "$OUT/bench-hf-decode.txt")
  say "hf gpu tests"
  (cd "$W/evalkit" && EVALKIT_GPU_HF=$M/smollm2-hf timeout 220 $PY -X faulthandler -m pytest -v -s -p no:cacheprovider -m gpu \
     tests/test_gpu.py -k "cuda_graph or compiled" > "$OUT/gpu-tests-hf.log" 2>&1; grep -E "PASSED|FAILED|ERROR|passed|failed|float32|^E " "$OUT/gpu-tests-hf.log" | head -20)
}

case "$STEP" in
build)
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'transformers', transformers.__version__)"
  build_llama; smollm_models
  $PY -c "import llama_cpp; print('llama_supports_gpu_offload', llama_cpp.llama_supports_gpu_offload())"
  gpu_tests
  "$BIN/llama-bench" -m "$M/smollm2-Q4_K_M.gguf" -m "$M/smollm2-Q8_0.gguf" -ngl 99 -fa 0 -p 128 -n 128 -r 5 -o md 2>&1 | tail -6
  ;;
run) build_llama; smollm_models; load_order_check; smollm_run ;;
llama-decode) build_llama; smollm_models; load_order_check; decode_bench ;;
qwen) build_llama; qwen_run with_q4 ;;
decode) smollm_hf; hf_decode ;;
# Everything one cold machine can do in one call (10 minutes): what does not fit in the time left is skipped.
all)
  build_llama; smollm_models; load_order_check; smollm_run
  if [ "$(elapsed)" -lt 390 ]; then qwen_run; else say "skipped: Qwen (time)"; fi
  if [ "$(elapsed)" -lt 520 ]; then gpu_tests 60; else say "skipped: gpu tests (time)"; fi
  ;;
*) echo "unknown step $STEP"; exit 2 ;;
esac
say "done $STEP"
