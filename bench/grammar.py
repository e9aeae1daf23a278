"""What holding a reply to a grammar costs (``runtime/grammar.py``, ``runtime/tools.py``): a JSON schema
(``response_format``) and OpenAI tool calls (``tools``, hermes' format with Qwen's ``<tool_call>`` and ``<think>``
tokens) in each ``tool_choice``, on a byte-level BPE of a real vocabulary's size trained here (50,000 tokens, the
size of GPT-2's; no checkpoint is downloaded).

Per grammar: the first request's setup (the tokenizer read by llguidance, once per tokenizer, and the grammar
compiled), each later request's (compiled again, as each request's tools are its own), and the cost per token
(the mask computed over the vocabulary, applied to the logits, and the grammar advanced by the token picked),
over replies the grammar allows: prose, then a call. For scale: a decode step of GPT-2 small is ~12 ms on these
2 cores (bench/generate.py).

    python bench/grammar.py
"""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tripy_build.runtime.grammar import constraints
from tripy_build.runtime.tokenizer import Tokenizer
from tripy_build.runtime.tools import HERMES, Tools, tokens_of

VOCAB = 50_000
WX = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city", "unit"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}}, "required": ["query"]}}}
ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"},
                                           "sources": {"type": "array", "items": {"type": "string"}}},
          "required": ["answer", "confidence", "sources"]}
PROSE = "Let me check the weather for you. I will look it up now, then answer in a sentence or two.\n"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 3}}\n</tool_call>'


def trained_tokenizer(root: Path) -> Tokenizer:
    """A GPT-2-style byte-level BPE of ``VOCAB`` tokens, trained on the Python standard library's source, with
    Qwen's added tokens (ChatML's specials; ``<tool_call>``, ``<think>`` and their ends, not special)."""
    import tokenizers

    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "**", "*.py"), recursive=True))[:1500]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    def texts():
        for f in files:
            yield Path(f).read_text(encoding="utf-8", errors="replace")
    tok.train_from_iterator(texts(), tokenizers.trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                    for t in ("<tool_call>", "</tool_call>", "<think>", "</think>")])
    return Tokenizer({"tokenizer.json": tok.to_str().encode()}, str(root))


def per_token(tok: Tokenizer, make, text: str, eos: int) -> tuple[float, int]:
    """The mean ms per token to mask the logits, and advance by the token, over ``text``'s tokens."""
    ids = tok._fast.encode(text, add_special_tokens=False).ids
    logits = np.random.default_rng(0).normal(size=tok.vocab_size)
    constraint = make([eos])
    t0 = time.perf_counter()
    for token in ids:
        masked = constraint.mask(logits)
        assert np.isfinite(masked[token]), tok.decode([token])
        constraint.advance(token)
    return (time.perf_counter() - t0) * 1e3 / len(ids), len(ids)


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        tok = trained_tokenizer(Path(root))
        print(f"tokenizer: {tok.vocab_size} tokens, trained in {time.perf_counter() - t0:.0f} s\n")
    eos = tok.token_id("<|im_end|>")
    tags, words = tokens_of(tok, HERMES)
    tools = [WX, SEARCH]
    cases = [
        ("response_format json_schema", ANSWER, json.dumps(
            {"answer": "Paris is sunny", "confidence": 0.9, "sources": ["a", "b"]}, separators=(", ", ": "))),
        ("tools auto: prose, then a call", Tools(tools).grammar(HERMES, tags, words), PROSE + CALL),
        ("tools auto: <think>, prose", Tools(tools).grammar(HERMES, tags, words), "<think>\nweather?\n</think>\n\n" + PROSE),
        ("tools required: a call", Tools(tools, "required").grammar(HERMES, tags, words), CALL),
    ]
    print(f"{'grammar':<34} {'first request s':>15} {'next request ms':>15} {'per token ms':>12} {'tokens':>6}")
    first = True
    for name, grammar, text in cases:
        t0 = time.perf_counter()
        make = constraints(tok, grammar, tok.vocab_size)
        make([eos])
        setup = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(5):
            constraints(tok, grammar, tok.vocab_size)([eos])
        again = (time.perf_counter() - t0) * 1e3 / 5
        ms, n = per_token(tok, make, text, eos)
        print(f"{name:<34} {setup:>15.2f} {again:>15.1f} {ms:>12.3f} {n:>6}"
              + ("   (first: llguidance reads the vocabulary)" if first else ""))
        first = False


if __name__ == "__main__":
    main()
