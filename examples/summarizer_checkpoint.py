"""A summarizer as a Hugging Face checkpoint: a ``BartForConditionalGeneration`` of random weights with BART's kind of
tokenizer (``examples/nli_checkpoint.py``'s) and facebook/bart-large-cnn's generation settings: the first token
forced to ``<s>``, the last to ``</s>``, and its beam search (4 beams, ``length_penalty`` 2, ``early_stopping``),
saved with ``save_pretrained``::

    python examples/summarizer_checkpoint.py my-summarizer            # tiny: 2 + 2 layers of 16
    python examples/summarizer_checkpoint.py my-summarizer --large    # bart-large-cnn's sizes (400M parameters)
    python -m tripy_build model=bart task=generate params.checkpoint=my-summarizer

Its summaries are noise (random weights, a tiny vocabulary); the real checkpoint builds the same way. Needs
transformers and torch (``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: its folder is on the path, the repository is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.nli_checkpoint import TINY, main, tokenizer


def checkpoint(path: str | Path, sizes: dict | None = None, vocab_size: int | None = None):
    """The tokenizer and the model (``sizes``: ``BartConfig`` settings, ``TINY`` by default; ``vocab_size``: the
    model's rows, the tokenizer's by default) saved in ``path``; returns the PyTorch model and the tokenizer."""
    import torch
    import transformers

    fast = tokenizer(path)
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=vocab_size or len(fast), **(sizes or TINY), init_std=0.5,
                                     forced_eos_token_id=2)
    model = transformers.BartForConditionalGeneration(config).eval()
    model.generation_config.forced_bos_token_id = 0
    model.generation_config.update(num_beams=4, length_penalty=2.0, early_stopping=True)
    model.save_pretrained(path)
    return model, fast


if __name__ == "__main__":
    main(checkpoint, "my-summarizer")
