"""The checkpoint's tokenizer, stored in the artifact it builds (``tokenizer/``) for text in and out
(``runtime/tokenizer.py``): a generate artifact's prompts and replies, an encoder's texts to embed."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..artifact.digest import digest_bytes
from ..errors import CallError
from ..runtime.marian_tokenizer import FILES as MARIAN_FILES
from ..runtime.stored_tokenizer import read
from ..runtime.tokenizer import FILES

log = logging.getLogger(__name__)

# The tokenizer class transformers' AutoTokenizer picks for a checkpoint whose tokenizer_config.json names none
# (bert-base-uncased, and the fine-tunes saved before tokenizer_config.json held its class): config.json's
# ``tokenizer_class``, else its ``model_type``'s (transformers 5.24's TOKENIZER_MAPPING, for the zoo's model types;
# the others get a generic tokenizer). The class decides whether a text pair's second text has token type 1
# (``runtime/tokenizer.TYPED``): a BERT cross-encoder read without it would score every pair as one text.
BY_MODEL_TYPE = {"albert": "AlbertTokenizer", "bert": "BertTokenizer", "distilbert": "BertTokenizer",
                 "electra": "BertTokenizer", "deberta": "DebertaTokenizer", "deberta-v2": "DebertaV2Tokenizer",
                 "roberta": "RobertaTokenizer", "bart": "RobertaTokenizer", "camembert": "CamembertTokenizer",
                 "xlm-roberta": "XLMRobertaTokenizer", "mpnet": "MPNetTokenizer", "gpt2": "GPT2Tokenizer",
                 "qwen2": "Qwen2Tokenizer", "qwen3": "Qwen2Tokenizer", "qwen2_moe": "Qwen2Tokenizer",
                 "qwen3_moe": "Qwen2Tokenizer", "gemma": "GemmaTokenizer", "gemma2": "GemmaTokenizer",
                 "gemma3_text": "GemmaTokenizer", "olmoe": "GPTNeoXTokenizer",
                 "clip": "CLIPTokenizer", "clip_text_model": "CLIPTokenizer", "t5": "T5Tokenizer", "mt5": "T5Tokenizer",
                 "umt5": "T5Tokenizer"}


def files(checkpoint: str | None) -> dict[str, bytes]:
    """A Hugging Face directory's tokenizer files by name (``FILES``: ``tokenizer.json``, its config and chat
    template; or a Marian translator's, ``MARIAN_FILES``: ``source.spm``, ``target.spm``, ``vocab.json``), read once
    as the loaders will read them; none without either or with one that cannot be read, and the log says what the
    artifact then takes."""
    root = Path(checkpoint) if checkpoint is not None else None
    if root is None:
        return {}
    if not (root / FILES[0]).is_file() and all((root / n).is_file() for n in MARIAN_FILES[:3]):
        stored = {name: (root / name).read_bytes() for name in MARIAN_FILES if (root / name).is_file()}
    elif not (root / FILES[0]).is_file():
        log.info("%s has no %s (a fast tokenizer: tokenizer.save_pretrained(DIR) writes one): the artifact takes and "
                 "gives token ids only, not text.", root, FILES[0])
        return {}
    else:
        stored = {name: (root / name).read_bytes() for name in FILES if (root / name).is_file()}
        _name_class(stored, root)
    try:
        read(stored, str(root))  # read as the artifact's loaders will read it
    except CallError as e:
        log.warning("%s: the artifact takes and gives token ids only, not text: %s", root, e)
        return {}
    return stored


def key_part(stored: dict[str, bytes]) -> dict[str, str]:
    """Each file's digest by name: a changed tokenizer or chat template is a new build."""
    return {name: digest_bytes(data) for name, data in stored.items()}


def _name_class(stored: dict[str, bytes], root: Path) -> None:
    """Write into the stored ``tokenizer_config.json`` the class AutoTokenizer would load where it names none
    (``BY_MODEL_TYPE``), so that the loaders read the tokenizer as transformers does; said in the log. A file that is
    not a JSON object is left for ``Tokenizer`` to refuse."""
    try:
        config = json.loads(stored.get(FILES[1], b"{}"))
        model = json.loads((root / "config.json").read_text()) if (root / "config.json").is_file() else {}
    except ValueError:
        return
    if not isinstance(config, dict) or config.get("tokenizer_class") or not isinstance(model, dict):
        return
    named = model.get("tokenizer_class") or BY_MODEL_TYPE.get(model.get("model_type"))
    if isinstance(named, str) and named:
        stored[FILES[1]] = json.dumps({**config, "tokenizer_class": named}, indent=2).encode()
        log.info("%s: %s names no tokenizer class; read as %s, as transformers' AutoTokenizer reads it (config.json's "
                 "%s).", root, FILES[1], named, "tokenizer_class" if model.get("tokenizer_class") else "model_type")
