"""Models written the way their libraries' documentation writes them, for tests of building a user's own
model from a config: call arguments that are not inputs (``train``, ``deterministic``), several inputs in
an order of their own, and functions taking their inputs by position."""

import flax.linen as linen
import jax
import jax.numpy as jnp
from flax import nnx


class LinenTrainFlag(linen.Module):
    """Linen's usual shape for a module with batch norm and dropout: ``__call__(x, train)``."""

    features: int

    @linen.compact
    def __call__(self, x, train: bool):
        x = linen.Dense(self.features)(x)
        x = linen.BatchNorm(use_running_average=not train)(x)
        x = linen.Dropout(0.5, deterministic=not train)(x)
        return linen.Dense(3)(linen.relu(x))


class NNXMasked(nnx.Module):
    """An NNX module with two inputs and a keyword flag, as NNX's docs write dropout's."""

    def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs):
        self.linear = nnx.Linear(din, dout, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x, mask, *, deterministic: bool = False):
        return self.dropout(self.linear(x * mask), deterministic=deterministic)


def masked_init(key, width: int):
    return {"w": jax.random.normal(key, (width, 3))}


def masked_apply(params, mask, x):
    """Its parameters in another order than the config lists its inputs (x, then mask)."""
    return (x * mask) @ params["w"]


def positional_apply(params, *inputs):
    """Inputs by position only: ``features [batch, width]`` then ``bias [batch, 3]``."""
    features, bias = inputs
    return features @ params["w"] + bias


def positional_init(key, width: int):
    return {"w": jnp.ones((width, 3))}


class NNXAttention(nnx.Module):
    """An encoder layer taking an attention mask as Hugging Face's models do: ``(x, attention_mask)``, the
    mask int32 ``[batch, seq]``, 1 at real tokens and 0 at padding."""

    def __init__(self, width: int, heads: int, *, rngs: nnx.Rngs):
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=width, decode=False, rngs=rngs)
        self.norm = nnx.LayerNorm(width, rngs=rngs)

    def __call__(self, x, attention_mask):
        keep = attention_mask.astype(bool)
        return self.norm(x + self.attn(x, mask=nnx.make_attention_mask(keep, keep)))


class NNXEmbed(nnx.Module):
    """Token ids -> their rows of a table: an id past the table gives NaN in XLA's gather (no error)."""

    def __init__(self, vocab: int, width: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, width, rngs=rngs)

    def __call__(self, ids):
        return self.embed(ids)
