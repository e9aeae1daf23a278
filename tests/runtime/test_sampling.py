"""``runtime/generate.Sampler``: nucleus sampling against transformers' own warper."""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from tripy_build.errors import CallError  # noqa: E402
from tripy_build.runtime.generate import Sampler  # noqa: E402


def test_top_p_keeps_the_tokens_hugging_faces_warper_keeps():
    """Nucleus sampling over the same support as transformers' ``TopPLogitsWarper`` (after ``top_k``), sampled in
    proportion within it; ``top_p`` outside (0, 1] is refused."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 40)).astype(np.float32) * 3
    for top_p in (0.05, 0.5, 0.9):
        want = transformers.TopPLogitsWarper(top_p)(None, torch.tensor(logits)).isfinite().numpy()
        sampler = Sampler(1.0, None, 0, top_p)
        seen = np.zeros_like(want)
        for _ in range(400):
            seen[np.arange(3), sampler(logits)] = True
        assert not (seen & ~want).any() and (seen == want).mean() > 0.95, top_p
    assert (Sampler(1.0, None, 1, 1e-6)(logits) == logits.argmax(-1)).all()
    for bad in (0, 1.5, True):
        with pytest.raises(CallError, match="top_p="):
            Sampler(1.0, None, 0, bad)
