"""The tokenizer an artifact stores (under ``tokenizer/``), read as the kind it is: a fast tokenizer
(``runtime/tokenizer.py``: ``tokenizer.json``) or a Marian translator's SentencePiece files
(``runtime/marian_tokenizer.py``: ``source.spm``, no ``tokenizer.json``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import CallError
from .marian_tokenizer import MarianTokenizer
from .tokenizer import DIR, Tokenizer


def read(files: Mapping[str, bytes], where: str) -> Tokenizer:
    """The tokenizer of these files (by name): a Marian translator's where they are ``source.spm`` and no
    ``tokenizer.json``, else a fast tokenizer's."""
    if "tokenizer.json" not in files and "source.spm" in files:
        return MarianTokenizer(files, where)
    return Tokenizer(files, where)


def stored_files(artifact_dir: Any, names: Sequence[str], where: str) -> dict[str, bytes]:
    """The tokenizer files an artifact stores (``names``, under ``tokenizer/``) by name, each checked against its digest
    in the manifest first."""
    from ..artifact.read import read_files

    if not names:
        return {}
    if artifact_dir is None:
        raise CallError(f"{where}: a tokenizer is read from a saved artifact; save this executable and load it.")
    _, contents = read_files(artifact_dir, [DIR + n for n in names], prefixes=[])
    return {n: bytes(contents[DIR + n]) for n in names}


def load(artifact_dir: Any, names: Sequence[str], where: str) -> Tokenizer:
    """The tokenizer an artifact stores (``stored_files``)."""
    if not names:
        raise CallError(f"{where}: this artifact has no tokenizer, so it takes and gives token ids only: its checkpoint "
                        "had no tokenizer.json. Save the tokenizer beside the model (tokenizer.save_pretrained(DIR)) "
                        "and build again.")
    return read(stored_files(artifact_dir, names, where), where)
