"""Tokenizer-only stand-ins: the same token ids as an engine's `tokenize` / `prompt_token_ids`, without
loading the model.

The engine-result cache keys every request by its exact prompt token ids, so a re-run must tokenize before
it knows whether it needs the engine at all. A stand-in does that cheaply (llama.cpp: the GGUF's vocabulary
only, well under a second; vLLM: the checkpoint's Hugging Face tokenizer, no vLLM start-up) and is an
`Engine` whose model calls raise: the lazy engine in `evalkit.cache` loads the real engine for those.

vLLM's chat-template rule (`chat_prompt_ids`) is defined here, with no vLLM import, and `VllmEngine` uses the
same function, so there is one definition and `import vllm` (seconds) is not paid for tokenizing.
"""
from __future__ import annotations

from importlib.metadata import version
from typing import Any, Iterator, Sequence

from evalkit.engines.base import Engine, EngineInfo, GenRequest, GenResult, SamplingParams, TokenScores


def engine_package_version(engine: str) -> str | None:
    """The installed engine package's version, read from its metadata (no import); None if not installed."""
    from evalkit.engines import engine_spec

    try:
        packages = engine_spec(engine).package
    except KeyError:
        return None
    for dist in packages:
        try:
            return version(dist)
        except Exception:  # this distribution is not installed; try the next name
            continue
    return None


class TokenizerOnly(Engine):
    """An engine that only tokenizes (each engine module builds its own on it: llama.cpp's is in llamacpp.py)."""

    def info(self) -> EngineInfo:
        raise NotImplementedError("a tokenizer-only stand-in has no engine description")

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        raise NotImplementedError("a tokenizer-only stand-in cannot generate")

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        raise NotImplementedError("a tokenizer-only stand-in cannot score")

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        raise NotImplementedError("a tokenizer-only stand-in cannot score")

    # -- the vocabulary, for an engine that tokenizes with a stand-in (the served engine, `evalkit.engines.openai`,
    # on the deployment's weights): what it would otherwise read from the model it does not load.

    def bos(self) -> tuple[bool, int | None]:
        """Whether `tokenize(text, add_bos=True)` prepends BOS, and BOS's id (None: the vocabulary has none)."""
        raise NotImplementedError

    def vocab_size(self) -> int:
        raise NotImplementedError

    def end_of_generation_ids(self) -> frozenset[int]:
        """The ids that end a generation (EOS, end-of-turn): a server streams the one that stopped it."""
        raise NotImplementedError


def chat_prompt_ids(tokenizer: Any, prompt: str, *, add_bos: bool, bos_token_id: int | None) -> list[int]:
    """One user turn through the tokenizer's chat template, with the generation prompt.

    The rendered text is tokenized with special tokens parsed (the template writes them) and no
    automatic specials; BOS is prepended when the model adds one and the template did not write it,
    which is what the llama.cpp engine does with the same template.
    """
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    ids = list(tokenizer(text, add_special_tokens=False).input_ids)
    if add_bos and bos_token_id is not None and ids[:1] != [bos_token_id]:
        ids.insert(0, bos_token_id)
    return ids


class HfTokens:
    """Tokenization through a Hugging Face tokenizer, as vLLM does it: shared by VllmEngine and its stand-in.

    Needs `_tok`, `_bos`, `_add_bos`, `_chat_template` and `_use_chat` on the instance.
    """

    _tok: Any
    _bos: int | None
    _add_bos: bool
    _chat_template: str | None
    _use_chat: bool

    def tokenize_like(self, other: "HfTokens") -> None:
        """Tokenize exactly as `other` does (an engine set up from its tokenizer-only stand-in)."""
        self._tok, self._bos, self._add_bos = other._tok, other._bos, other._add_bos
        self._chat_template, self._use_chat = other._chat_template, other._use_chat

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        # split_special_tokens: text that spells a special token ("<eos>") stays text, as llama.cpp's
        # tokenize(special=False) does; add_special_tokens adds BOS (and EOS, if this tokenizer adds one,
        # as llama.cpp's add_special does) only when the tokenizer is set to.
        return list(self._tok(text, add_special_tokens=add_bos, split_special_tokens=True).input_ids)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        # Special tokens are not rendered, like vLLM's own output text and llama.cpp's detokenize().
        return self._tok.decode(list(token_ids), skip_special_tokens=True)

    def prompt_token_ids(self, request: GenRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        if self._use_chat and request.chat:
            return chat_prompt_ids(self._tok, request.prompt, add_bos=self._add_bos, bos_token_id=self._bos)
        return self.tokenize(request.prompt, add_bos=True)

    def prompt_format(self, request: GenRequest) -> str:
        return "chat" if request.chat and self._use_chat and request.prompt_token_ids is None else "completion"


class VllmTokenizer(HfTokens, TokenizerOnly):
    """VllmEngine's tokenization with the checkpoint's HF tokenizer (what `LLM.get_tokenizer()` loads)."""

    name = "vllm"

    def __init__(self, model_path: str, options: Any) -> None:
        from transformers import AutoTokenizer

        self.model_path = str(model_path)
        self._tok = AutoTokenizer.from_pretrained(self.model_path)
        bos = getattr(self._tok, "bos_token_id", None)
        self._bos: int | None = int(bos) if bos is not None else None
        probe = self._tok("a", add_special_tokens=True).input_ids  # as VllmEngine: BOS read from behaviour
        self._add_bos = self._bos is not None and probe[:1] == [self._bos]
        template = getattr(self._tok, "chat_template", None)
        self._chat_template = template if isinstance(template, str) and template else None
        self._use_chat = self._chat_template is not None and options.chat_template == "auto"

    def bos(self) -> tuple[bool, int | None]:
        return self._add_bos, self._bos

    def vocab_size(self) -> int:
        return len(self._tok)

    def end_of_generation_ids(self) -> frozenset[int]:
        """EOS and every special id of the tokenizer."""
        return frozenset(int(t) for t in [self._tok.eos_token_id, *getattr(self._tok, "all_special_ids", [])] if t is not None)


def load_tokenizer(engine: str, model_path: str | None, options: Any) -> Engine:
    """The tokenizer-only stand-in for `engine` on `model_path` (its spec's `tokenizer_loader`)."""
    from evalkit.engines import engine_spec

    return engine_spec(engine).tokenizer_loader(model_path, options)
