"""The inputs of a model over token ids, as Hugging Face names them and fills them."""

from __future__ import annotations


class TokenInputs:
    """``inputs``, ``input_dtypes``, ``input_values`` and ``input_defaults`` of a text model: int32 ``[batch, seq]``
    each of ``_names()`` (``input_ids`` and ``attention_mask``; an encoder with token types adds
    ``token_type_ids``); ids in ``[0, vocab_size)``, the mask 0 or 1 (ones where a call leaves it out), token types
    in ``[0, type_vocab_size)`` (zeros)."""

    vocab_size: int

    def _names(self) -> tuple[str, ...]:
        return ("input_ids", "attention_mask")

    def inputs(self) -> dict[str, list]:
        return {n: ["batch", "seq"] for n in self._names()}

    def input_dtypes(self) -> dict[str, str]:
        return {n: "int32" for n in self._names()}

    def input_values(self) -> dict[str, tuple[int, int]]:
        """The values each integer input may hold, ``[lo, hi)``: a call outside is refused."""
        values = {"input_ids": (0, self.vocab_size), "attention_mask": (0, 2),
                  "token_type_ids": (0, getattr(self, "type_vocab_size", 0))}
        return {n: values[n] for n in self._names()}

    def input_defaults(self) -> dict[str, int]:
        """What a call may leave out, as Hugging Face fills it: ``attention_mask`` ones, ``token_type_ids`` zeros."""
        return {n: v for n, v in (("attention_mask", 1), ("token_type_ids", 0)) if n in self._names()}
