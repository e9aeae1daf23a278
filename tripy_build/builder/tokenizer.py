"""The checkpoint's tokenizer, stored in the artifact it builds (``tokenizer/``) for text in and out
(``runtime/tokenizer.py``): a generate artifact's prompts and replies, an encoder's texts to embed."""

from __future__ import annotations

import logging
from pathlib import Path

from ..artifact.digest import digest_bytes
from ..errors import CallError
from ..runtime.tokenizer import FILES, Tokenizer

log = logging.getLogger(__name__)


def files(checkpoint: str | None) -> dict[str, bytes]:
    """A Hugging Face directory's tokenizer files by name (``FILES``: ``tokenizer.json``, its config and chat
    template), read once as the loaders will read them; none without a fast tokenizer (``tokenizer.json``) or with
    one that cannot be read, and the log says what the artifact then takes."""
    root = Path(checkpoint) if checkpoint is not None else None
    if root is None:
        return {}
    if not (root / FILES[0]).is_file():
        log.info("%s has no %s (a fast tokenizer: tokenizer.save_pretrained(DIR) writes one): the artifact takes and "
                 "gives token ids only, not text.", root, FILES[0])
        return {}
    stored = {name: (root / name).read_bytes() for name in FILES if (root / name).is_file()}
    try:
        Tokenizer(stored, str(root))  # read as the artifact's loaders will read it
    except CallError as e:
        log.warning("%s: the artifact takes and gives token ids only, not text: %s", root, e)
        return {}
    return stored


def key_part(stored: dict[str, bytes]) -> dict[str, str]:
    """Each file's digest by name: a changed tokenizer or chat template is a new build."""
    return {name: digest_bytes(data) for name, data in stored.items()}
