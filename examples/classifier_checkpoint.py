"""A fine-tuned text classifier as a Hugging Face checkpoint: a ``BertForSequenceClassification`` of random weights
with its class names (``id2label``) and a WordPiece tokenizer (``[CLS] ... [SEP]``, ``[PAD]`` 0, as BERT's), saved
with ``save_pretrained`` as the Hub's fine-tunes are::

    python examples/classifier_checkpoint.py my-classifier
    python -m tripy_build model=hf params.checkpoint=my-classifier
    python examples/classifier_checkpoint.py my-ner --ner   # a BertForTokenClassification tagging O, B-PER, ... I-LOC

Its classes are noise (random weights, a tiny vocabulary); a real checkpoint (a downloaded sentiment model) builds
the same way. Needs transformers and torch (``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: its folder is on the path, the repository is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.chat_checkpoint import CORPUS


def checkpoint(path: str | Path, model_class: type | None = None, **config) -> Path:
    """The tokenizer and a 2-layer BERT over its vocabulary (``BertForSequenceClassification`` unless
    ``model_class``); ``config``: more ``BertConfig`` settings (``id2label``)."""
    import torch
    import transformers
    from tokenizers import BertWordPieceTokenizer
    from tokenizers.processors import TemplateProcessing

    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(CORPUS, vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                           show_progress=False)
    cls, sep = wp.token_to_id("[CLS]"), wp.token_to_id("[SEP]")
    wp._tokenizer.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=wp._tokenizer, unk_token="[UNK]", sep_token="[SEP]",
                                                pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    fast.save_pretrained(path)
    torch.manual_seed(0)
    (model_class or transformers.BertForSequenceClassification)(transformers.BertConfig(
        vocab_size=len(fast), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=64, **config)).eval().save_pretrained(path)
    return Path(path)


NER_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}  # a named-entity tagger's, in the BIO scheme

if __name__ == "__main__":
    import transformers

    ner = "--ner" in sys.argv[1:]  # a token classifier (a NER model) instead of a sentence classifier
    names = [a for a in sys.argv[1:] if a != "--ner"]
    print(checkpoint(names[0] if names else "my-classifier",
                     transformers.BertForTokenClassification if ner else None,
                     id2label=NER_LABELS if ner else {0: "negative", 1: "positive"}))
