"""MPNet (Hugging Face ``MPNetModel``, with its pooler, and its heads), in plain JAX.

Fields are ``MPNetConfig``'s keys, defaults mpnet-base's sizes (``microsoft/mpnet-base``'s and
``all-mpnet-base-v2``'s ``config.json``: 514 positions, ``layer_norm_eps`` 1e-5), so a checkpoint's
``config.json`` maps onto the dataclass by key (see ``tripy_build.models.hf``).

Inputs (int32 ``[batch, seq]``, Hugging Face's names): ``input_ids``, ``attention_mask`` (1 = real token, 0 =
padding); MPNet has no token types. Output: ``{"last_hidden_state": [batch, seq, hidden_size], "pooler_output":
[batch, hidden_size]}``, or a head's (``models/heads.py``, RoBERTa's: a sequence classifier through a dense layer
and tanh of its own; the masked-LM head's GELU whatever ``hidden_act``).

    h = LN(word[ids] + position[counted from the pad id])               # RoBERTa's positions
    B = relative_attention_bias[bucket(j - i)]                          # [heads, s, s], once for every layer
    per layer: a = LN(h + Out(Attention(h, bias B + mask)));  h = LN(a + Down(act(Up(a))))     # BERT's post-LN
    pooler_output = tanh(Pooler(h[:, 0]))

BERT's encoder (``models/bert.py``) with two differences, both as transformers' ``modeling_mpnet.py`` has them:

- positions count from ``MPNetEmbeddings.padding_idx``, 1, whatever ``pad_token_id`` says (Hugging Face
  hardcodes it): the first token that is not id 1 is at position 2, an id-1 token at the pad row, so
  ``max_position_embeddings`` serves 2 fewer tokens (mpnet-base's 514 serve 512);
- every layer's attention scores get T5's relative position bias: the key-minus-query distance ``j - i`` in one
  of 32 buckets (``relative_position_bucket``: 8 exact distances each way, then logarithmic up to 128), each
  bucket a learned bias per head. Hugging Face computes the buckets with its default of 32 whatever
  ``relative_attention_num_buckets`` says (``MPNetEncoder.compute_position_bias(x)``), so the table's rows past
  32 are never read, and fewer than 32 would index past it: refused.

Masking: keys where ``attention_mask == 0`` get the additive bias ``finfo(float32).min``, as BERT's. The relative
bias depends on ``j - i`` alone and a position counts only the tokens before it, so a sequence padded at the end
(any ids there, pad ids included) gives, at its real positions and in ``pooler_output`` (position 0), the
unpadded result. Hence ``padding = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}``.

Params (Hugging Face's layouts: Linear weights ``[out, in]``; loading a checkpoint is a rename)::

    {"embeddings": {"word": [vocab_size, d], "position": [max_position_embeddings, d], "ln": {"scale", "bias"}},
     "relative_attention_bias": [relative_attention_num_buckets, num_attention_heads],
     "layers": [...],              # BERT's (models/bert.py), num_hidden_layers of them
     "pooler": {"weight": [d, d], "bias": [d]}}
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .bert import (
    _linear, _ln, check_encoder, counted_positions, encode, encoder_outputs, init_layers,
)
from ._tokens import TokenInputs
from .heads import Headed, STYLES, Style, has_pooler, init as init_head
from ._layers import Params, embed, layer_norm, mask_bias, normal_init

PADDING_IDX = 1  # MPNetEmbeddings.padding_idx: where positions count from
NUM_BUCKETS = 32  # the buckets MPNetEncoder.compute_position_bias uses (its default; the config's is not passed)
MAX_DISTANCE = 128  # relative_position_bucket's default: distances beyond share the last bucket


def relative_position_bucket(relative_position: np.ndarray, num_buckets: int = NUM_BUCKETS,
                             max_distance: int = MAX_DISTANCE) -> np.ndarray:
    """T5's bidirectional bucket of each key-minus-query distance, as transformers' ``T5Attention`` and
    ``MPNetEncoder.relative_position_bucket`` compute it (in float32; MPNet's: 32 buckets, ``max_distance`` 128): a key
    before its query in the first half of the buckets, after it in the second; distances below a quarter of the
    buckets exact, then logarithmic, ``max_distance`` and beyond in the last."""
    n = -np.asarray(relative_position, np.int64)
    half = num_buckets // 2
    exact = half // 2
    ret = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    ratio = np.log(np.maximum(n, 1).astype(np.float32) / exact) / np.float32(math.log(max_distance / exact))
    large = np.minimum(exact + (ratio * np.float32(half - exact)).astype(np.int64), half - 1)
    return ret + np.where(n < exact, n, large)


@functools.lru_cache(maxsize=None)
def _buckets(num_buckets: int, max_distance: int) -> np.ndarray:
    """The bucket of every distance -max_distance..max_distance (farther ones clip to the ends: the same buckets)."""
    return relative_position_bucket(np.arange(-max_distance, max_distance + 1), num_buckets, max_distance).astype(np.int32)


def position_bias(table: jax.Array, seq: Any, num_buckets: int = NUM_BUCKETS, max_distance: int = MAX_DISTANCE
                  ) -> jax.Array:
    """``[1, heads, seq, seq]``: each query's bias for each key from ``table`` (``[buckets, heads]``) by the
    bucket of ``key - query``; ``seq`` static or symbolic."""
    distance = jnp.arange(seq)[None, :] - jnp.arange(seq)[:, None]
    buckets = jnp.take(jnp.asarray(_buckets(num_buckets, max_distance)),
                       jnp.clip(distance, -max_distance, max_distance) + max_distance)
    return jnp.transpose(embed(table, buckets), (2, 0, 1))[None]


@dataclass(frozen=True)
class MPNet(Headed, TokenInputs):
    vocab_size: int = 30527
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 514
    layer_norm_eps: float = 1e-5
    relative_attention_num_buckets: int = 32
    head: str = "auto"  # models/heads.HEADS; auto: the checkpoint's (config.json's architectures), none without one
    num_labels: int = 2  # the classes of a classification head (config.json: id2label's size)
    labels: tuple = ()  # the classes' names, in id order (config.json's id2label; default LABEL_0, LABEL_1, ...)
    problem_type: str | None = None  # a classifier's (config.json's): its scores' function (output_scores); null: by num_labels
    pooling: str = "none"  # none | mean | cls: a sentence_embedding output (the encoder alone), as sentence-transformers
    normalize: bool = False  # the sentence_embedding scaled to unit length (cosine similarity as a dot product)

    name: ClassVar[str] = "mpnet"
    style: ClassVar[Style] = STYLES["mpnet"]
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}

    def __post_init__(self) -> None:
        check_encoder(self)
        if self.relative_attention_num_buckets < NUM_BUCKETS:
            raise ValueError(f"relative_attention_num_buckets={self.relative_attention_num_buckets}: MPNetModel looks "
                             f"relative positions up in {NUM_BUCKETS} buckets whatever this says (Hugging Face's "
                             f"compute_position_bias default), so the table needs at least {NUM_BUCKETS} rows.")

    def init(self, key: jax.Array) -> Params:
        d = self.hidden_size
        k_word, k_pos, k_rel, k_pool, *k_layers = jax.random.split(key, 4 + self.num_hidden_layers)
        params = {"embeddings": {"word": normal_init(k_word, (self.vocab_size, d)),
                                 "position": normal_init(k_pos, (self.max_position_embeddings, d)), "ln": _ln(d)},
                  "relative_attention_bias": normal_init(k_rel, (self.relative_attention_num_buckets,
                                                                 self.num_attention_heads)),
                  "layers": init_layers(k_layers, d, self.intermediate_size)}
        if has_pooler(self.task, self.style):
            params["pooler"] = _linear(k_pool, d, d)
        if self.task != "none":
            params["head"] = init_head(jax.random.fold_in(key, 1), self.task, self.style, d, self.num_labels,
                                        self.vocab_size, _linear, _ln)
        return params

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        emb = params["embeddings"]
        h = embed(emb["word"], input_ids) + counted_positions(emb["position"], input_ids, PADDING_IDX)
        h = layer_norm(emb["ln"], h, self.layer_norm_eps)
        bias = (position_bias(params["relative_attention_bias"], input_ids.shape[1])
                + mask_bias(attention_mask != 0, h.dtype)[:, None, None, :])  # [b, heads, s, s]
        h = encode(self, params["layers"], h, bias)
        return encoder_outputs(self, params, h, attention_mask)

    def max_positions(self) -> int:
        """The longest sequence the position table holds (its first ``PADDING_IDX + 1`` rows hold none)."""
        return self.max_position_embeddings - PADDING_IDX - 1
