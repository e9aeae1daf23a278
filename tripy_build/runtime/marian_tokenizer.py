"""Text in and out of a Marian translator (Helsinki-NLP's opus-mt): its SentencePiece tokenizer, which has no
``tokenizer.json`` (transformers' ``MarianTokenizer`` is SentencePiece's, in Python).

A Marian checkpoint's tokenizer is three files: ``source.spm`` (the SentencePiece model that splits a source
text into pieces), ``target.spm`` and ``vocab.json`` (each piece's id in the model's vocabulary, which the pieces
of both languages share; a piece it lacks is ``<unk>``). As transformers 5 reads them:

- ``encode(text)``: the special tokens in the text (``</s>``, ``<unk>``, ``<pad>``) kept as theirs, each part
  between them split by ``source.spm`` (a multilingual model's leading language code, ``>>fr<<``, kept whole),
  the pieces looked up in ``vocab.json``, and ``</s>`` appended.
- ``decode(ids)``: the special ids left out, the pieces joined by ``source.spm`` (transformers' default, where the
  vocabulary is shared), ``▁`` a space, the ends stripped. An id ``vocab.json`` lacks is ``source.spm``'s piece of
  that id, as transformers falls back to it; one past both (transformers raises) is left out.

``sentencepiece`` (Google's library, what transformers runs) is imported only here, when a translator's text is
used. Tested against ``transformers.MarianTokenizer`` on a SentencePiece model trained in the test.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from ..errors import CallError
from .tokenizer import Tokenizer, cleaned_up

FILES = ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json")
SPIECE_UNDERLINE = "▁"


class MarianTokenizer(Tokenizer):
    """A Marian checkpoint's tokenizer from its files' bytes (``FILES``): a ``Tokenizer`` for text in and out of a
    translator (``encode``, ``decode``, ``stream``, ``token_bytes``); token spans and grammars are not a
    translator's, and are refused by name (a chat template too: it has none)."""

    def __init__(self, files: Mapping[str, bytes], where: str):
        try:
            import sentencepiece
        except ImportError:
            raise CallError("a Marian translator's text needs the sentencepiece package (pip install "
                            "sentencepiece).") from None
        self.where = where
        try:
            config = json.loads(bytes(files.get("tokenizer_config.json", b"{}")).decode())
            self.vocab = json.loads(bytes(files["vocab.json"]).decode())
            self._spm = sentencepiece.SentencePieceProcessor(model_proto=bytes(files["source.spm"]))
        except Exception as e:  # noqa: BLE001 - sentencepiece raises RuntimeError and OSError for a bad model
            raise CallError(f"{where}: the Marian tokenizer is not readable: {str(e).splitlines()[0][:200]}.") from None
        if not isinstance(config, dict) or not isinstance(self.vocab, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in self.vocab.items()):
            raise CallError(f"{where}: tokenizer_config.json must be a JSON object and vocab.json an object of pieces "
                            "to ids.")
        if config.get("separate_vocabs"):
            raise CallError(f"{where}: a Marian tokenizer with separate source and target vocabularies "
                            "(separate_vocabs: true) is not read; the artifact takes and gives token ids only.")
        self.special_tokens = {k: str(config.get(k) or default) for k, default in
                               (("eos_token", "</s>"), ("unk_token", "<unk>"), ("pad_token", "<pad>"))}
        missing = [t for t in self.special_tokens.values() if t not in self.vocab]
        if missing:
            raise CallError(f"{where}: vocab.json has no {missing[0]!r}, which a Marian tokenizer needs.")
        self.pieces = {i: p for p, i in self.vocab.items()}
        self._special_ids = {self.vocab[t] for t in self.special_tokens.values()}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in sorted(self.special_tokens.values(),
                                                                              key=len, reverse=True)) + ")")
        self._cleanup = bool(config.get("clean_up_tokenization_spaces"))
        self.gives_types = False
        self.chat_template = None
        self.derived: dict[Any, Any] = {}
        self._bytes: dict[int, bytes] = {}

    @property
    def pad_token_id(self) -> int:
        return self.vocab[self.special_tokens["pad_token"]]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def unk_token_id(self) -> int | None:
        return self.vocab[self.special_tokens["unk_token"]]

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, ``</s>`` appended, as ``MarianTokenizer(text)["input_ids"]``."""
        if not isinstance(text, str):
            raise CallError(f"{self.where}: text to encode must be a string, got {type(text).__name__}.")
        unk = self.unk_token_id
        ids: list[int] = []
        for part in self._split.split(text):
            if part in self.special_tokens.values():
                ids.append(self.vocab[part])
            elif part:
                code = []
                if part.startswith(">>") and (end := part.find("<<")) != -1:  # a target language's code
                    code, part = [part[:end + 2]], part[end + 2:]
                ids += [self.vocab.get(p, unk) for p in [*code, *self._spm.encode(part, out_type=str)]]
        return [*ids, self.vocab[self.special_tokens["eos_token"]]]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens left out, as ``MarianTokenizer.decode(ids, skip_special_tokens=True)``."""
        size = self._spm.get_piece_size()  # an id vocab.json lacks is the SentencePiece model's, as transformers reads it
        pieces = [self.pieces[t] if t in self.pieces else self._spm.id_to_piece(t)
                  for t in map(int, ids) if t not in self._special_ids and (t in self.pieces or 0 <= t < size)]
        text = self.tokens_to_string(pieces)
        return cleaned_up(text) if self._cleanup else text

    def token_id(self, text: str) -> int | None:
        return self.vocab.get(text)

    def text_tokens(self) -> list[int]:
        return []

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` stands for: its piece, ``▁`` a space; a special token its text."""
        piece = self.pieces.get(int(token))
        return b"" if piece is None else piece.replace(SPIECE_UNDERLINE, " ").encode()

    def _not_here(self, what: str) -> CallError:
        return CallError(f"{self.where}: {what} is not a Marian translator's: its tokenizer (SentencePiece) encodes "
                         "and decodes text.")

    def spans(self, text: str, pair: str | None = None) -> Any:
        raise self._not_here("a text's token spans")

    def windows(self, text: str, max_length: int, stride: int) -> Any:
        raise self._not_here("a text in windows")

    def tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Pieces joined by ``source.spm``, ``▁`` a space, the ends stripped (transformers' ``convert_tokens_to_string``
        for pieces without special tokens)."""
        return self._spm.decode_pieces(list(tokens)).replace(SPIECE_UNDERLINE, " ").strip()

    @property
    def marks_subwords(self) -> bool:
        return False

    def serialized(self) -> str:
        raise self._not_here("a grammar (json_schema)")
