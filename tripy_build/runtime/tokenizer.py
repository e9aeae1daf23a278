"""Text in and out of an artifact: the checkpoint's tokenizer, stored in the artifact.

A build from a Hugging Face directory that holds a fast tokenizer (``tokenizer.json``, what ``save_pretrained`` of
any tokenizer on the Hub writes) stores it under ``tokenizer/`` with its ``tokenizer_config.json`` and chat
template (``chat_template.jinja``, or the config's ``chat_template``), each file digested in the manifest
(``metadata.generate.tokenizer`` lists them). Text is then encoded, decoded and put in the chat template as
Hugging Face's tokenizer does it, with the same libraries and no torch: ``tokenizers`` (the Rust tokenizer
``transformers`` runs) and ``jinja2``, imported only when text is used.

- ``encode(text)``: the ids ``tokenizer(text)["input_ids"]`` gives (special tokens added as ``tokenizer.json``'s
  post-processor says: Llama's and Gemma's BOS).
- ``chat(messages)``: ``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``'s ids: the
  template rendered in jinja2's immutable sandbox (a template is code from the checkpoint's author), then
  encoded without adding special tokens (the template writes them).
- ``decode(ids)``: ``decode(ids, skip_special_tokens=True)``.
- ``spans(text)``: the ids with each token's vocabulary string, characters and whether it was added
  (``return_offsets_mapping``, ``return_special_tokens_mask``), what a token classifier's entities are read from.
- ``pad(rows)``: token-id rows as one batch, padded on the right as ``padding=True`` pads them.
- ``stream()``: a ``Detokenizer`` that turns ids into text as they come, holding back a character split
  across tokens until it is whole (what ``/generate_stream`` and the chat API send).

Tested against ``transformers.AutoTokenizer`` on checkpoints' tokenizers of both kinds (byte-level BPE as GPT-2,
Llama 3 and Qwen have; sentencepiece-style with byte fallback as Llama 2 and Gemma). A Marian translator's
tokenizer has no ``tokenizer.json``: ``read`` gives ``runtime/marian_tokenizer.py``'s for its SentencePiece files.
"""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import CallError

DIR = "tokenizer/"  # where the files lie in an artifact
FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
SPECIALS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# the tokenizer classes whose model_input_names hold token_type_ids (transformers 5.24's): only they give a pair's
# token types; the others (RoBERTa's, XLM-RoBERTa's, a generic tokenizer.json's) leave the model its zeros
TYPED = ("BertTokenizer", "CanineTokenizer", "ConvBertTokenizer", "DPRContextEncoderTokenizer",
         "DPRQuestionEncoderTokenizer", "DebertaTokenizer", "DebertaV2Tokenizer", "ElectraTokenizer", "FNetTokenizer",
         "LayoutLMTokenizer", "LayoutLMv2Tokenizer", "LxmertTokenizer", "MarkupLMTokenizer", "MobileBertTokenizer",
         "SqueezeBertTokenizer", "TapasTokenizer")


def _content(token: Any) -> str | None:
    """A special token as a config writes it: a string, or an ``AddedToken``'s dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _plain(value: Any, where: str) -> Any:
    """JSON data only (what a template may see): a caller's other objects are refused, not handed to the sandbox."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    raise CallError(f"{where}: a chat message or template argument holds {type(value).__name__}; they are JSON data "
                    "(strings, numbers, lists and objects).")


def cleaned_up(text: str) -> str:
    """``text`` with the spaces before punctuation and English contractions removed, as transformers'
    ``clean_up_tokenization`` removes them (a config's ``clean_up_tokenization_spaces``)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class Spans(NamedTuple):
    """A text's tokens (``Tokenizer.spans``): ids, vocabulary strings, ``(start, end)`` character offsets into the
    text (``(0, 0)`` for an added token), whether each was added by the tokenizer, and token types (a pair's)."""

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    special: list[bool]
    type_ids: list[int]


class Tokenizer:
    """A checkpoint's tokenizer, from its files' bytes (``FILES``: ``tokenizer.json`` at least)."""

    def __init__(self, files: Mapping[str, bytes], where: str):
        try:
            from tokenizers import Tokenizer as Fast
        except ImportError:
            raise CallError("text in and out needs the tokenizers package (pip install tokenizers jinja2).") from None
        self.where = where
        try:
            self._fast = Fast.from_str(bytes(files["tokenizer.json"]).decode())
            config = json.loads(bytes(files.get("tokenizer_config.json", b"{}")).decode())
            specials = json.loads(bytes(files.get("special_tokens_map.json", b"{}")).decode())
        except Exception as e:  # noqa: BLE001 - tokenizers raises its own exception types
            raise CallError(f"{where}: the tokenizer is not readable: {str(e).splitlines()[0][:200]}.") from None
        # a tokenizer.json may carry truncation and padding (sentence-transformers' save theirs): transformers turns
        # both off for a call that does not ask for them, and so does this, so that no text is cut without a word
        self._fast.no_truncation()
        self._fast.no_padding()
        if not isinstance(config, dict) or not isinstance(specials, dict):
            raise CallError(f"{where}: tokenizer_config.json and special_tokens_map.json must be JSON objects.")
        self.special_tokens = {k: t for k in SPECIALS if (t := _content(config.get(k, specials.get(k)))) is not None}
        names = config.get("model_input_names")
        kind = str(config.get("tokenizer_class") or "").removesuffix("Fast")
        # whether tokenizer(text, pair) gives token_type_ids (the config's model_input_names, else its class's)
        self.gives_types = "token_type_ids" in names if isinstance(names, list) else kind in TYPED
        template = files.get("chat_template.jinja")
        self.chat_template = bytes(template).decode() if template is not None else config.get("chat_template")
        if isinstance(self.chat_template, list):  # named templates: the default one
            self.chat_template = next((t.get("template") for t in self.chat_template
                                       if isinstance(t, dict) and t.get("name") == "default"), None)
        self._cleanup = bool(config.get("clean_up_tokenization_spaces")) and \
            type(self._fast.model).__name__ != "BPE"  # transformers skips it for BPE: it strips real spaces
        self._template = None
        self._added = set(self._fast.get_added_tokens_decoder())
        self.derived: dict[Any, Any] = {}  # what other modules make of this tokenizer once (runtime/grammar.py)
        self._bytes: dict[int, bytes] = {}
        self._cut: Any = None  # a copy of the tokenizer that truncates, for ``windows``, and the lock it is used under
        self._cut_lock = threading.Lock()

    @property
    def pad_token_id(self) -> int:
        """The id that pads a batch of texts to one length (the config's ``pad_token``; 0 without one)."""
        pad = self.special_tokens.get("pad_token")
        found = self._fast.token_to_id(pad) if pad is not None else None
        return 0 if found is None else found

    @property
    def vocab_size(self) -> int:
        """The ids the tokenizer can give, its added tokens included."""
        return self._fast.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, special tokens added as the checkpoint's tokenizer adds them."""
        if not isinstance(text, str):
            raise CallError(f"{self.where}: text to encode must be a string, got {type(text).__name__}.")
        return self._fast.encode(text, add_special_tokens=True).ids

    def spans(self, text: str, pair: str | None = None) -> "Spans":
        """``text`` encoded as ``encode`` encodes it (with ``pair``: the two texts as one sequence, as
        ``tokenizer(text, pair)`` joins a cross-encoder's query and passage), with what each token stands for: its
        vocabulary string, its characters ``(start, end)`` in its text, whether the tokenizer added it (``[CLS]``,
        ``<s>``) and its token type (1 in a pair's second text where the tokenizer marks it and transformers gives
        ``token_type_ids``: ``gives_types``, as BERT's does): the fast tokenizer's offsets, special-tokens mask and
        type ids, as transformers gives them."""
        for t in (text, pair):
            if t is not None and not isinstance(t, str):
                raise CallError(f"{self.where}: text to encode must be a string, got {type(t).__name__}.")
        e = self._fast.encode(text, pair, add_special_tokens=True)
        return self._spans(e)

    def _spans(self, e: Any) -> "Spans":
        return Spans(e.ids, e.tokens, [tuple(o) for o in e.offsets], [bool(s) for s in e.special_tokens_mask],
                     e.type_ids if self.gives_types else [0] * len(e.ids))

    def windows(self, text: str, max_length: int, stride: int) -> list["Spans"]:
        """``text`` as ``spans`` encodes it, cut into windows of at most ``max_length`` tokens (the added ones
        included), each after the first repeating the last ``stride`` tokens of the one before: what transformers'
        fast tokenizers give for ``tokenizer(text, truncation=True, max_length=..., stride=...,
        return_overflowing_tokens=True)`` (the same ``tokenizers`` truncation), offsets into the whole text."""
        if not isinstance(text, str):
            raise CallError(f"{self.where}: text to encode must be a string, got {type(text).__name__}.")
        room = max_length - self._fast.num_special_tokens_to_add(False)
        if isinstance(stride, bool) or not isinstance(stride, int) or not 0 <= stride < room:
            raise CallError(f"stride must be a whole number of tokens from 0 to {room - 1} (a window holds {room} of the "
                            f"text's tokens: the build's seq of {max_length} less the tokenizer's added ones), got "
                            f"{stride!r}.")
        # one copy, set per call under a lock: truncation is a tokenizer's state (self._fast's calls must not see it),
        # and a copy per stride a client may ask for would be a copy of the vocabulary each
        with self._cut_lock:
            if self._cut is None:
                from tokenizers import Tokenizer as Fast

                self._cut = Fast.from_str(self._fast.to_str())
            self._cut.enable_truncation(max_length, stride=stride)
            e = self._cut.encode(text, add_special_tokens=True)
        return [self._spans(w) for w in [e, *e.overflowing]]

    def pad(self, rows: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None = None,
            width: int | None = None) -> dict[str, np.ndarray]:
        """Token-id rows as one batch, as transformers pads one (``padding=True``; with ``width``,
        ``padding="max_length"`` to it): ``input_ids`` int32 ``[rows, longest]`` filled on the right with
        ``pad_token_id``, ``attention_mask`` 1 over each row's tokens, and, given each row's token types
        (``Spans.type_ids``), ``token_type_ids`` (0 in the padding)."""
        width = width or max(map(len, rows))
        out = {"input_ids": np.full((len(rows), width), self.pad_token_id, np.int32),
               "attention_mask": np.zeros((len(rows), width), np.int32)}
        if types is not None:
            out["token_type_ids"] = np.zeros((len(rows), width), np.int32)
        for i, row in enumerate(rows):
            out["input_ids"][i, :len(row)], out["attention_mask"][i, :len(row)] = row, 1
            if types is not None:
                out["token_type_ids"][i, :len(row)] = types[i]
        return out

    def tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Vocabulary strings joined into text by the tokenizer's decoder (``##`` pieces glued, ``Ġ`` a space), as
        transformers' ``convert_tokens_to_string``; joined with spaces where the tokenizer has no decoder."""
        decoder = self._fast.decoder
        return decoder.decode(list(tokens)) if decoder is not None else " ".join(tokens)

    @property
    def marks_subwords(self) -> bool:
        """Whether the vocabulary marks a word's later pieces (WordPiece's ``##``): then a token is a word's
        continuation exactly when its string is longer than the text it covers."""
        return bool(getattr(self._fast.model, "continuing_subword_prefix", None))

    @property
    def unk_token_id(self) -> int | None:
        """The id of the unknown token (``[UNK]``), or None where the tokenizer has none."""
        unk = self.special_tokens.get("unk_token")
        return self._fast.token_to_id(unk) if unk is not None else None

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens left out."""
        text = self._fast.decode([int(t) for t in ids], skip_special_tokens=True)
        return cleaned_up(text) if self._cleanup else text

    def token_id(self, text: str) -> int | None:
        """The id of the token that is exactly ``text`` (an added token such as ``<tool_call>``); None if none is."""
        return self._fast.token_to_id(text)

    def text_tokens(self) -> list[int]:
        """The added tokens that are text, not special (decoding keeps them): Qwen's ``<tool_call>``, ``<think>``."""
        return sorted(i for i, t in self._fast.get_added_tokens_decoder().items() if not t.special)

    def serialized(self) -> str:
        """``tokenizer.json`` as read (truncation and padding off), for llguidance (``runtime/grammar.py``): made
        when a grammar needs it, not at load (a 150k vocabulary serializes to ~10 MB)."""
        return self._fast.to_str()

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` stands for in the text (OpenAI's log probabilities report them: a character that
        spans tokens is in none of their strings whole): a byte-level BPE token's characters mapped back to
        bytes (GPT-2's table, as Llama 3's and Qwen's tokenizers use it), a byte-fallback token (``<0x0A>``) its
        byte, a sentencepiece token's ``▁`` a space; an added or special token its text; an id past the tokenizer's
        vocabulary (a model's logits padded past it), which decoding leaves out too, none."""
        found = self._bytes.get(token)
        if found is None:
            piece = self._fast.id_to_token(int(token))
            if piece is None:  # a model's logits padded past its tokenizer (Qwen2.5's 151936 over 151665 tokens)
                found = b""
            elif int(token) in self._added:
                found = piece.encode()
            elif type(self._fast.decoder).__name__ == "ByteLevel":
                found = bytes(_BYTE_OF[c] for c in piece) if all(c in _BYTE_OF for c in piece) else piece.encode()
            elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
                found = bytes([int(piece[3:5], 16)])
            else:
                found = piece.replace("\u2581", " ").encode()
            self._bytes[token] = found
        return found

    def render(self, messages: Sequence[Mapping[str, Any]], /, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> str:
        """The chat template applied to ``messages`` (``[{"role": "user", "content": "Hi"}, ...]``), as text;
        ``tools``: the functions the model may call, as OpenAI's API and ``apply_chat_template`` take them
        (``[{"type": "function", "function": {"name": ..., "parameters": {...}}}]``); ``kwargs`` are variables the
        template reads, as ``apply_chat_template`` passes its own (Qwen3's ``enable_thinking=False``)."""
        if not self.chat_template:
            raise CallError(f"{self.where}: the checkpoint's tokenizer has no chat template (tokenizer_config.json's "
                            "chat_template or chat_template.jinja), so messages cannot be put into the model's chat "
                            "format; send a plain prompt (text_input), or rebuild from a checkpoint that has one.")
        if not isinstance(messages, (list, tuple)) or not messages or not all(isinstance(m, Mapping) for m in messages):
            raise CallError(f"{self.where}: messages must be a non-empty list of objects such as "
                            '{"role": "user", "content": "Hello"}.')
        for m in messages:
            if not isinstance(m.get("role"), str):
                raise CallError(f"{self.where}: every message needs a role (system, user or assistant): "
                                f"{str(dict(m))[:80]}.")
        chat = [{k: v for k, v in _plain(dict(m), self.where).items() if v is not None} for m in messages]
        if tools is not None and not (isinstance(tools, (list, tuple)) and all(isinstance(t, Mapping) for t in tools)):
            raise CallError(f"{self.where}: tools must be a list of objects such as "
                            '{"type": "function", "function": {"name": ..., "parameters": {...}}}.')
        taken = sorted(set(kwargs) & {"messages", "documents"})
        if taken:
            raise CallError(f"{self.where}: the chat template's variable {taken[0]!r} is set by the call itself, not "
                            "by its template arguments.")
        import jinja2

        try:
            return self._compiled().render(messages=chat, add_generation_prompt=add_generation_prompt,
                                           tools=None if tools is None else _plain(list(tools), self.where),
                                           documents=None, **{**self.special_tokens, **_plain(kwargs, self.where)})
        except jinja2.TemplateError as e:
            raise CallError(f"{self.where}: the chat template refused the messages: {str(e)[:300]}") from None

    def chat(self, messages: Sequence[Mapping[str, Any]], /, add_generation_prompt: bool = True,
             tools: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> list[int]:
        """The ids of ``messages`` in the chat template (``tools`` and ``kwargs``: as ``render``'s), ready to
        generate the assistant's reply."""
        return self.encode_rendered(self.render(messages, add_generation_prompt, tools, **kwargs))

    def encode_rendered(self, text: str) -> list[int]:
        """The ids of a prompt the chat template rendered (``render``): no special tokens added, the template
        wrote them."""
        return self._fast.encode(text, add_special_tokens=False).ids

    def stream(self) -> "Detokenizer":
        """A ``Detokenizer`` for one sequence's new tokens."""
        return Detokenizer(self)

    def _compiled(self) -> Any:
        if self._template is None:
            self._template = _environment().from_string(self.chat_template)
        return self._template


def _environment() -> Any:
    """jinja2's immutable sandbox with what chat templates on the Hub call, as transformers sets it up."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (marks a training target): rendered as its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character each byte is written as in its vocabulary, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF = _byte_level_alphabet()


class Detokenizer:
    """Text from one sequence's tokens as they come: each ``add`` returns the text they complete. A character that
    spans tokens (byte-level BPE splits most non-Latin characters) is held back until its last byte arrives, and
    only a window of recent tokens is decoded each time (a few before the text already given, so that a tokenizer
    that drops a leading space decodes them in context)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # where the window starts
        self._read = 0  # the ids whose text has been given

    def add(self, token: int) -> str:
        self._ids.append(int(token))
        before = self._tok.decode(self._ids[self._prefix:self._read])
        text = self._tok.decode(self._ids[self._prefix:])
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = max(0, self._read - 4), len(self._ids)
        return text[len(before):]

    def flush(self) -> str:
        """What is left at the end (a character whose last byte never came, as the replacement character)."""
        before = self._tok.decode(self._ids[self._prefix:self._read])
        text = self._tok.decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(before):]
