"""A CLIP model as a Hugging Face checkpoint: a ``CLIPModel`` of random weights and a CLIP tokenizer of letters (its
end of text 53, which also pads, as CLIP's ``<|endoftext|>``), saved with ``save_pretrained``::

    python examples/clip_checkpoint.py my-clip               # tiny: 2 + 2 layers of 16, 12 x 12 images
    python examples/clip_checkpoint.py my-clip --base        # clip-vit-base-patch32's sizes (151M parameters)
    python -m tripy_build model=hf params.checkpoint=my-clip shapes=image_text
    python -m tripy_build model=clip_text params.checkpoint=my-clip     # the text tower and its projection alone

Its answers are noise (random weights, a tokenizer that spells); the real checkpoint builds the same way, and its
zero-shot answers come from ``model.zero_shot_image(pixel_values, labels)``. Needs transformers and torch
(``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import sys
from pathlib import Path

EOS = 53
TINY = dict(text_config=dict(vocab_size=60, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                             num_attention_heads=2, max_position_embeddings=12, eos_token_id=EOS, bos_token_id=EOS - 1,
                             pad_token_id=EOS),
            vision_config=dict(hidden_size=16, intermediate_size=20, num_hidden_layers=2, num_attention_heads=4,
                               image_size=12, patch_size=4),
            projection_dim=8, logit_scale_init_value=1.7)
# CLIPConfig's defaults: clip-vit-base-patch32's sizes
BASE = dict(text_config=dict(eos_token_id=EOS, bos_token_id=EOS - 1, pad_token_id=EOS), vision_config={})


def tokenizer(path: str | Path | None = None):
    """A CLIP tokenizer whose words are spelled letter by letter (``a cat``: ``a</w> c a t</w>``), saved in ``path``."""
    import transformers

    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {c: i for i, c in enumerate(letters)} | {c + "</w>": 26 + i for i, c in enumerate(letters)}
    vocab |= {"<|startoftext|>": EOS - 1, "<|endoftext|>": EOS}
    tok = transformers.CLIPTokenizer(vocab=vocab, merges=[])
    if path is not None:
        tok.save_pretrained(path)
    return tok


def checkpoint(path: str | Path, sizes: dict | None = None):
    """The tokenizer and the model (``sizes``: ``CLIPConfig`` settings, ``TINY`` by default) saved in ``path``;
    returns the PyTorch model and the tokenizer."""
    import torch
    import transformers

    tok = tokenizer(path)
    torch.manual_seed(0)
    model = transformers.CLIPModel(transformers.CLIPConfig(**(sizes or TINY))).eval()
    model.save_pretrained(path)
    return model, tok


if __name__ == "__main__":
    names = [a for a in sys.argv[1:] if a != "--base"]
    out = names[0] if names else "my-clip"
    checkpoint(out, BASE if "--base" in sys.argv[1:] else None)
    print(out)
