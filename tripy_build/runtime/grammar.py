"""Structured output: a reply held to a JSON schema (OpenAI's ``response_format``) or to tool calls
(``runtime/tools.py``), token by token.

At each step the tokens that cannot continue a text the schema accepts are masked out of the logits before a
token is picked (greedy or sampled, with every sampling option), and the token picked advances the grammar;
once the schema's text is complete the only tokens left are the model's end ids, and where it can go no
further the reply ends there. The grammar engine is llguidance (Microsoft's Rust library, as vLLM and SGLang
use it): it compiles the schema, walks the checkpoint's own tokenizer (``tokenizer.json``, read by its Rust
tokenizers as ours is) and computes a step's mask in microseconds rather than scanning the vocabulary.
Imported only when a call constrains its reply.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Sequence

import numpy as np

from ..errors import CallError

_LOCK = threading.Lock()
# JSON laid out as Python's json.dumps lays it out (", " and ": ", no other whitespace): what models have read most,
# and no run of newlines for a weak model to loop in (llguidance's default allows any whitespace between tokens)
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def tokenizer_for(tokenizer: Any, eos: Sequence[int], vocab: int) -> Any:
    """llguidance's view of ``tokenizer`` (``runtime/tokenizer.Tokenizer``) with ``eos`` as the ids that end a
    reply and ``vocab`` logits per step; made once per tokenizer and end ids (~1 s for a 150k vocabulary)."""
    key = (tuple(int(t) for t in eos), int(vocab))
    with _LOCK:
        made = tokenizer.derived
        if key not in made:
            try:
                import llguidance
            except ImportError:
                raise CallError("a reply held to a schema needs llguidance (pip install llguidance).") from None
            if not eos:
                raise CallError(f"{tokenizer.where}: a reply held to a grammar (a JSON schema, tool calls) needs an end "
                                "id to stop at, and there is none: the call's eos_token_id is empty, or the artifact "
                                "has none (build with generate.eos_token_id set).")
            made[key] = llguidance.LLTokenizer(tokenizer.serialized(), n_vocab=int(vocab), eos_token=list(key[0]))
        return made[key]


def schema_of(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema of an OpenAI ``response_format``: ``{"type": "json_object"}`` (any object),
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``; None for ``{"type": "text"}``."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if isinstance(spec, dict) and isinstance(spec.get("schema", {}), dict):
            return spec.get("schema") or {"type": "object"}
    raise CallError(f"response_format={json.dumps(response_format)[:80]}: it is {{\"type\": \"text\"}}, "
                    '{"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}.')


class Lark(str):
    """A grammar in llguidance's Lark dialect (``runtime/tools.py`` writes them for tool calls), told apart from a
    caller's string where a JSON schema is expected."""


def constraints(tokenizer: Any, grammar: dict[str, Any] | Lark, vocab: int) -> Any:
    """A function of a call's end ids giving each row a new ``Constraint`` to ``grammar``: a JSON schema (a dict) or
    a ``Lark`` grammar. It is compiled once per end ids (the first row's); the other rows get copies of its fresh
    matcher."""
    if not isinstance(grammar, (dict, Lark)):
        raise CallError(f"json_schema={str(grammar)[:60]}: a JSON schema is an object, such as {{\"type\": \"object\"}}.")
    compiled: dict[tuple[int, ...], Any] = {}

    def make(eos: Sequence[int]) -> Constraint:
        key = tuple(int(t) for t in eos)
        if key not in compiled:
            compiled[key] = _matcher(tokenizer_for(tokenizer, key, vocab), grammar)
        return Constraint(compiled[key].deep_copy())
    return make


def _matcher(guidance: Any, grammar: dict[str, Any] | Lark) -> Any:
    """llguidance's matcher of ``grammar`` (``constraints``') over ``guidance``'s vocabulary, at its start; a
    ``CallError`` saying why where it cannot be compiled."""
    import llguidance

    what = "the JSON schema" if isinstance(grammar, dict) else "the tool-call grammar"
    try:
        text = (llguidance.LLMatcher.grammar_from_json_schema(grammar, defaults=LAYOUT) if isinstance(grammar, dict)
                else llguidance.LLMatcher.grammar_from_lark(grammar))
    except (ValueError, TypeError) as e:
        raise CallError(f"{what} is not usable: {str(e)[:200]}") from None
    matcher = llguidance.LLMatcher(guidance, text, log_level=0)
    if matcher.is_error():
        raise CallError(f"{what} is not usable: {matcher.get_error()[:300]}")
    return matcher


class Constraint:
    """One reply's grammar (``matcher``: llguidance's, at its start): ``mask`` the logits of its next token,
    ``advance`` by the token picked; ``ended`` once the grammar can take no more tokens."""

    def __init__(self, matcher: Any):
        self.matcher = matcher

    def mask(self, scores: np.ndarray) -> np.ndarray:
        """``scores`` (one row's logits, float64) with every token the grammar refuses at ``-inf``."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[:scores.shape[-1]].astype(bool)
        if not allowed.any():
            raise CallError(f"the reply's grammar allows no token: {self.matcher.get_error()[:200]}")
        return np.where(allowed, scores, -np.inf)

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            raise CallError(f"token {token} broke the reply's grammar: {self.matcher.get_error()[:200]}")

    @property
    def ended(self) -> bool:
        return self.matcher.is_stopped()
