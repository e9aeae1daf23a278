"""An NLI classifier as a Hugging Face checkpoint: a ``BartForSequenceClassification`` of random weights with
facebook/bart-large-mnli's three classes (contradiction, neutral, entailment) and a byte-level BPE tokenizer that joins
a pair as BART's does (``<s> A </s></s> B </s>``, ``<pad>`` 1, ``</s>`` 2), saved with ``save_pretrained``::

    python examples/nli_checkpoint.py my-nli                # tiny: 2 + 2 layers of 16
    python examples/nli_checkpoint.py my-nli --large        # bart-large-mnli's sizes (400M parameters)
    python -m tripy_build model=hf params.checkpoint=my-nli

Its answers are noise (random weights, a tiny vocabulary); the real checkpoint builds the same way, and its zero-shot
answers come from ``model.zero_shot(texts, labels)`` and the server's ``zero_shot`` output. Needs transformers and
torch (``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: its folder is on the path, the repository is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.chat_checkpoint import CORPUS

LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}
TINY = dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)
LARGE = dict(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
             decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=1024)


def tokenizer(path: str | Path):
    """BART's kind of tokenizer (byte-level BPE, ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2) trained on a small corpus, saved
    in ``path``; returns it."""
    import tokenizers
    import transformers

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                            show_progress=False)
    bpe._tokenizer.post_processor = tokenizers.processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                                sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                                                pad_token="<pad>", mask_token="<mask>")
    fast.save_pretrained(path)
    return fast


def checkpoint(path: str | Path, sizes: dict | None = None, vocab_size: int | None = None):
    """The tokenizer and the model (``sizes``: ``BartConfig`` settings, ``TINY`` by default; ``vocab_size``: the
    model's rows, the tokenizer's by default) saved in ``path``; returns the PyTorch model and the tokenizer."""
    import torch
    import transformers

    fast = tokenizer(path)
    torch.manual_seed(0)
    model = transformers.BartForSequenceClassification(transformers.BartConfig(
        vocab_size=vocab_size or len(fast), **(sizes or TINY), id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()})).eval()
    model.save_pretrained(path)
    return model, fast


def main(write, default: str) -> None:
    """``python SCRIPT [DIR] [--large]``: ``write(DIR, sizes, vocab_size)``, at bart-large's sizes with ``--large``."""
    names = [a for a in sys.argv[1:] if a != "--large"]
    large = "--large" in sys.argv[1:]
    out = names[0] if names else default
    write(out, LARGE if large else None, 50265 if large else None)
    print(out)


if __name__ == "__main__":
    main(checkpoint, "my-nli")
