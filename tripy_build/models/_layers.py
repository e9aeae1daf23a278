"""Small shared building blocks for the model zoo (plain JAX, no framework).

Linear layers store ``weight`` as ``[out, in]`` (PyTorch/Tripy layout) and compute
``x @ weight.T + bias``. Initialisation follows PyTorch's default for ``nn.Linear`` / ``nn.Conv2d``:
uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]`` for weights and biases. Every parameter is float32.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

Params = dict[str, Any]


def _uniform(key: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def linear_init(key: jax.Array, dim_in: int, dim_out: int) -> Params:
    kw, kb = jax.random.split(key)
    return {"weight": _uniform(kw, (dim_out, dim_in), dim_in), "bias": _uniform(kb, (dim_out,), dim_in)}


def matmul(x: jax.Array, w: jax.Array, rows: bool = False) -> jax.Array:
    """``x @ w`` of ``x: [..., d]`` (any leading dims, static or symbolic) and a matrix ``w: [d, out]``; ``rows``:
    ``x @ w.T`` of ``w: [out, d]``, contracting ``w``'s rows where they are (no transposed copy).

    In bfloat16 on the CPU, ``x`` gets one row of zeros more, dropped from the product: XLA's CPU backend hands a
    bfloat16 product of one row (a batch-1 decode step, an LLM's every projection) to no library, converts the
    whole matrix to float32 on every call and runs a float32 product over it. Qwen2.5-0.5B's LM head (896 x
    151936) took 130 ms so, 12 ms with two rows (YNNPACK's bfloat16 kernel), and float32 16 ms; measured on jax
    0.12.0.1, 2-core x86. The extra row costs a copy of ``x``; other platforms and dtypes compute ``x @ w``."""
    def product(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ()))) if rows else jnp.matmul(x, w)
    if x.dtype != jnp.bfloat16:
        return product(x, w)

    def padded(x: jax.Array, w: jax.Array) -> jax.Array:
        flat = x.reshape(-1, x.shape[-1])
        y = product(jnp.concatenate([flat, jnp.zeros((1, flat.shape[1]), flat.dtype)]), w)
        return jax.lax.slice_in_dim(y, 0, flat.shape[0]).reshape(*x.shape[:-1], y.shape[-1])
    return jax.lax.platform_dependent(x, w, cpu=padded, default=product)


def scaled(w: jax.Array, scale: jax.Array) -> jax.Array:
    """``w * scale`` (a float32 factor per column, broadcast), computed in float32 and kept in ``w``'s dtype: a
    bfloat16 weight times a float32 one would be float32, and lift every product after it to float32."""
    return (w.astype(jnp.float32) * scale).astype(w.dtype)


def linear(params: Params, x: jax.Array) -> jax.Array:
    """``x @ weight.T + bias`` over the last axis of ``x`` (any leading dims, static or symbolic); a Linear without
    ``bias`` (``nn.Linear(..., bias=False)``: ModernBERT's) adds none."""
    y = matmul(x, params["weight"].T)
    return y + params["bias"] if "bias" in params else y


def layer_norm_init(dim: int) -> Params:
    return {"scale": jnp.ones((dim,), jnp.float32), "bias": jnp.zeros((dim,), jnp.float32)}


def layer_norm(params: Params, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """LayerNorm over the last axis, computed in float32 and returned in ``x``'s dtype (as PyTorch's is for half
    precision); without ``bias`` (``nn.LayerNorm(..., bias=False)``: ModernBERT's) it adds none."""
    y = x.astype(jnp.float32)
    mean = jnp.mean(y, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=-1, keepdims=True)
    y = (y - mean) * jax.lax.rsqrt(var + eps) * params["scale"].astype(jnp.float32)
    return (y + params["bias"].astype(jnp.float32) if "bias" in params else y).astype(x.dtype)


def conv_init(key: jax.Array, kernel: int, c_in: int, c_out: int) -> Params:
    """A ``kernel x kernel`` convolution with an HWIO kernel ``[k, k, c_in, c_out]`` and a bias."""
    kw, kb = jax.random.split(key)
    fan_in = kernel * kernel * c_in
    return {"kernel": _uniform(kw, (kernel, kernel, c_in, c_out), fan_in), "bias": _uniform(kb, (c_out,), fan_in)}


# --- Shared by the Hugging Face architectures (bert, gpt2, vit, resnet) --------------------------

def _quick_gelu(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(1.702 * x)


# Hugging Face's ``ACT2FN`` names (transformers/activations.py) -> the same function in JAX.
# "gelu" is the exact (erf) GELU; "gelu_new", "gelu_pytorch_tanh" and "gelu_fast" are all the tanh
# approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), which is jax.nn.gelu(approximate=True).
ACTIVATIONS: dict[str, Any] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "quick_gelu": _quick_gelu,
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "linear": lambda x: x,
}


def activation(name: str, setting: str = "activation"):
    """The activation Hugging Face calls ``name``; ``ValueError`` naming the setting and the supported names."""
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"{setting}={name!r} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}."
        ) from None


def normal_init(key: jax.Array, shape: tuple[int, ...], std: float = 0.02) -> jax.Array:
    return std * jax.random.normal(key, shape, jnp.float32)


def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
    """Rows of ``table`` for integer ``ids``; out-of-range ids are clamped (a gather never yields NaN)."""
    return jnp.take(table, ids, axis=0, mode="clip")


def head_logits(x: jax.Array, table: jax.Array) -> jax.Array:
    """``x @ table.T``: an output projection ``table: [vocab, d]`` (an LM head, or the embeddings it is tied to) over
    ``x: [..., d]``, in the layout XLA's CPU dot runs fastest at a few rows for the table's dtype: float32 from the
    table transposed (``[d, vocab]``, weight-only work done once at load; Qwen2.5-0.5B's at 8 rows 11.3 ms against
    19.9 over the table's own last axis), bfloat16 over the table's own rows (2 rows: 11.5 ms against 28.7)."""
    return matmul(x, table, rows=True) if table.dtype == jnp.bfloat16 else matmul(x, table.T)


def head_embed(table: jax.Array, ids: jax.Array) -> jax.Array:
    """``embed(table, ids)`` read from the copy of the table ``head_logits`` computes with, so that a model whose
    head is tied to its embeddings holds one."""
    return embed(table, ids) if table.dtype == jnp.bfloat16 else embed_columns(table.T, ids)


def embed_columns(table_t: jax.Array, ids: jax.Array) -> jax.Array:
    """``embed`` from the table transposed, ``[d, vocab]``: columns for ``ids``, ``[..., d]``. A model whose
    output projection is its tied embeddings transposed (``[d, vocab]``, the layout XLA's CPU dot runs fastest
    at a few rows) reads its inputs' embeddings from that one copy: a gather of 8x128 columns of Qwen2.5-0.5B's
    table costs 3 ms, against the 545 MB a second copy would hold."""
    return jnp.moveaxis(jnp.take(table_t, ids, axis=1, mode="clip"), 0, -1)


def positions(table: jax.Array, seq: Any) -> jax.Array:
    """Rows ``0..seq-1`` of a position table, ``[seq, d]``, for a static or symbolic ``seq``.

    (``table[:seq]`` would have the shape ``min(n, seq)`` under ``jax.export``, which does not broadcast
    against ``seq``; a gather of ``arange(seq)`` has the shape ``seq``. Positions past the table's end
    are clamped to its last row.)
    """
    return jnp.take(table, jnp.arange(seq), axis=0, mode="clip")


def mask_bias(keep: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
    """0 where ``keep``, the dtype's most negative finite value elsewhere (Hugging Face's additive mask).

    A finite bias keeps a fully masked row finite (its softmax is uniform), where ``-inf`` gives NaN.
    """
    return jnp.where(keep, jnp.zeros((), dtype), jnp.finfo(dtype).min)


def softmax(scores: jax.Array, bias: jax.Array | None, dtype: Any, sinks: jax.Array | None = None) -> jax.Array:
    """Attention probabilities from ``scores`` plus the additive mask ``bias``, over the last axis: in float32 (as
    Hugging Face's attention takes them for half-precision models), returned in ``dtype`` (the values'). ``sinks``
    (broadcast against ``scores`` with a last axis of 1: gpt-oss's learned logit per head) joins each row's
    normalisation as one more score whose probability is dropped, so a query may attend to less than a whole."""
    scores = scores.astype(jnp.float32)
    scores = scores if bias is None else scores + bias
    if sinks is None:
        return jax.nn.softmax(scores, axis=-1).astype(dtype)
    sinks = jnp.broadcast_to(sinks.astype(jnp.float32), scores.shape[:-1] + (1,))
    top = jax.lax.stop_gradient(jnp.maximum(jnp.max(scores, axis=-1, keepdims=True), sinks))
    e = jnp.exp(scores - top)
    return (e / (jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(sinks - top))).astype(dtype)


def attend(qkv: jax.Array, heads: int, bias: jax.Array | None = None) -> jax.Array:
    """Multi-head attention from a fused projection ``qkv: [b, s, 3 * d]`` (q already scaled) -> ``[b, s, d]``.

    The last axis is ``[q | k | v]``, each ``heads`` blocks of ``d // heads``, as Hugging Face splits them.
    ``bias`` (broadcastable to ``[b, heads, s, s]``) is added to the scores. Only the static last axis
    is reshaped, so ``b`` and ``s`` may be symbolic.
    """
    b, s, three_d = qkv.shape
    d = three_d // 3
    qkv = qkv.reshape(b, s, 3, heads, d // heads)
    # each [b, heads, s, hd] before the products, so that their batch axes lead: XLA's CPU backend ran the same
    # einsums over [b, s, heads, hd] up to 3x slower (whisper-base's encoder at batch 1, 1500 positions: 90 ms a
    # layer against 30; python bench/attention_layout.py)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    scores = jnp.einsum("bnqh,bnkh->bnqk", q, k)
    ctx = jnp.einsum("bnqk,bnkh->bnqh", softmax(scores, bias, v.dtype), v)
    return ctx.transpose(0, 2, 1, 3).reshape(b, s, d)


def cache_windows(max_length: int, smallest: int = 16) -> list[int]:
    """The key windows ``attend_cache`` picks from: ``max_length`` and its halves down to ``smallest``."""
    windows = [max_length]
    while windows[-1] % 2 == 0 and windows[-1] // 2 >= smallest:
        windows.append(windows[-1] // 2)
    return windows[::-1]


def extend_inputs(vocab_size: int, positions: int, cache_shape: Any, batch: Any, seq: Any, max_length: int,
                  one_row: bool, cache_dtype: str = "float32") -> dict[str, Any]:
    """A causal LM's ``extend`` inputs (GPT-2's, the Llama family's): a cache of ``batch`` rows
    (``cache_shape(batch, max_length)``, of ``cache_dtype``: the build's precision), and ``seq`` new tokens for every
    row, or (``one_row``) for the one row ``row`` names; with the values each may hold (``positions``: the position
    table's size)."""
    from ..core.spec import InputInfo

    n = 1 if one_row else batch
    inputs = {"input_ids": InputInfo((n, seq), "int32", (0, vocab_size)),
              "position_ids": InputInfo((n, seq), "int32", (0, positions)),
              "attention_mask": InputInfo((batch, max_length), "int32", (0, 2)),
              "cache": InputInfo(cache_shape(batch, max_length), cache_dtype),
              "cache_index": InputInfo((n,), "int32", (0, max_length))}
    if one_row:
        inputs["row"] = InputInfo((1,), "int32", (0, getattr(batch, "max", batch)))
    return inputs


def cache_step(attention_mask: jax.Array, cache_index: jax.Array, n: int, s: int,
               row: jax.Array | None) -> tuple[jax.Array, jax.Array, jax.Array, list[int]]:
    """What ``extend`` writes and attends with, for ``s`` new tokens of ``n`` rows at ``cache_index``: the cache
    rows they go to, each query's cache position ``[n, s]``, which cache positions each query sees ``[n, 1, s,
    max_length]`` (the real ones up to its own; ``within_window`` bounds it further) and the key windows
    ``attend_cache`` picks from (one row's prefill reads the whole cache: see ``attend_cache``)."""
    max_length = attention_mask.shape[1]
    if row is None:
        rows, mask = jnp.arange(n), attention_mask
    else:
        rows, mask = row, jax.lax.dynamic_slice_in_dim(attention_mask, row[0], 1, axis=0)
    query_at = cache_index[:, None] + jnp.arange(s)[None, :]
    keep = (jnp.arange(max_length)[None, None, :] <= query_at[:, :, None])[:, None] & (mask != 0)[:, None, None, :]
    return rows, query_at, keep, cache_windows(max_length) if row is None else [max_length]


def within_window(keep: jax.Array, query_at: jax.Array, window: int | None) -> jax.Array:
    """``keep`` (``[..., queries, keys]``, the keys at positions ``0, 1, ...``) limited to each query's last
    ``window`` positions, its own included: a sliding window (Mistral's), where a key at ``k`` is seen from ``q``
    only if ``q - k < window``, as Hugging Face's ``sliding_window_overlay`` counts it. ``query_at`` holds each
    query's position and broadcasts against ``keep`` without its last axis; ``window`` None: ``keep`` as it is."""
    if window is None:
        return keep
    return keep & (jnp.arange(keep.shape[-1]) > query_at[..., None] - window)


ATTENTION_TYPES = ("full_attention", "sliding_attention")  # Hugging Face's layer_types: every key, or a window


def layer_types(given: Any, layers: int, family: str) -> tuple[str, ...]:
    """A config's ``layer_types`` checked as a tuple (``()`` where it names none): one of ``ATTENTION_TYPES`` per
    layer; ``ValueError`` naming what is wrong and what ``family`` implements."""
    types = tuple(given or ())
    if types and len(types) != layers:
        raise ValueError(f"layer_types names {len(types)} layers, but num_hidden_layers is {layers}: one type per layer.")
    if set(types) - set(ATTENTION_TYPES):
        raise ValueError(f"layer_types holds {sorted(set(types) - set(ATTENTION_TYPES))}; {family} implements "
                         f"{', '.join(ATTENTION_TYPES)}.")
    return types


def rotate_half(x: jax.Array) -> jax.Array:
    """The rotary embedding's partner of each feature: ``[-x2, x1]`` of the halves ``[x1, x2]`` of the last axis (Hugging
    Face's ``rotate_half``)."""
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    """``cap * tanh(x / cap)`` (Gemma 2's soft cap of attention scores and logits); ``x`` where ``cap`` is None."""
    return x if cap is None else cap * jnp.tanh(x / cap)


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array,
                      cap: float | None = None, sinks: jax.Array | None = None) -> jax.Array:
    """``softmax(q k^T + bias) v`` of ``q: [b, s, heads, hd]`` (already scaled) over ``k, v: [b, kv, size, hd]``
    -> ``[b, s, heads, hd]``; ``bias`` broadcasts to ``[b, 1, s, size]``. ``heads`` is a multiple of ``kv``:
    each key/value head serves ``heads // kv`` query heads (grouped-query attention), read where it is rather
    than repeated for each, which wrote and read 7 copies of Qwen2.5-0.5B's cache per layer and step (its
    decode attention at batch 8: 62 ms a step repeated, 13 grouped). With ``kv == heads`` it is plain
    multi-head attention; ``cap``: the scores soft-capped (``softcap``) before the mask; ``sinks: [heads]``: each
    query head's sink logit (``softmax``)."""
    b, s, heads, hd = q.shape
    kv = k.shape[1]
    grouped = q.reshape(b, s, kv, heads // kv, hd)
    scores = softcap(jnp.einsum("bqngh,bnkh->bngqk", grouped, k), cap)
    sinks = None if sinks is None else sinks.reshape(1, kv, heads // kv, 1, 1)
    ctx = jnp.einsum("bngqk,bnkh->bqngh", softmax(scores, bias[:, :, None], v.dtype, sinks), v)
    return ctx.reshape(b, s, heads, hd)


def attend_cache(q: jax.Array, read: Any, bias: jax.Array, query_at: jax.Array, windows: list[int],
                 cap: float | None = None, sinks: jax.Array | None = None) -> jax.Array:
    """Attention of new tokens ``q: [b, s, heads, hd]`` over a key/value cache of ``windows[-1]`` positions.

    ``read(kind, size)`` returns the cache's first ``size`` keys (kind 0) or values (1), ``[b, kv, size, hd]``
    (``kv`` key/value heads, each serving ``heads // kv`` query heads: ``grouped_attention``); ``bias: [b, 1, s,
    max_length]`` masks what each query may not see; ``query_at: [b, s]`` holds each
    query's cache position, so no query sees past ``max(query_at)``. A chunk of more than one token reads only
    the smallest of ``windows`` (ascending, ``cache_windows``) that holds every position its queries may see:
    each window is a branch of its own, picked at run time. A prompt's first chunk into a cache twice its
    length (``max_length`` = prompt + new tokens) thus does half the attention work, as a cache that grows
    would. Each window adds its attention to the compiled program: ~0.4 s of XLA compile time per profile for
    GPT-2 small. ``cap``, ``sinks``: as ``grouped_attention``'s.
    """
    def window(size: int):
        def branch(q, bias):
            return grouped_attention(q, read(0, size), read(1, size), bias[..., :size], cap, sinks)
        return branch

    seen = jnp.max(query_at) + 1
    which = jnp.sum(seen > jnp.asarray(windows[:-1], jnp.int32)).astype(jnp.int32)
    # a step (one new token per row) always reads the whole cache: there the branch cost more than the window
    # saved once the cache was half full (GPT-2 small at batch 8). ``s`` is a constant in each compiled
    # profile, so XLA drops the untaken branches of a step's profile.
    which = jnp.where(jnp.asarray(q.shape[1]) > 1, which, len(windows) - 1)
    return jax.lax.switch(which, [window(w) for w in windows], q, bias)


def fused_qkv(q: Params, k: Params, v: Params, scale: float) -> tuple[jax.Array, jax.Array | None]:
    """Three ``[out, in]`` Linears -> one ``[in, 3 * out]`` weight and bias, q scaled by ``scale``.

    Weight-only work: tripy_build hoists it out of the compiled program and does it once at load.
    A Linear without ``bias`` counts as a zero bias; the result's bias is None when none has one.
    """
    w = jnp.concatenate([q["weight"] * scale, k["weight"], v["weight"]], axis=0).T
    if not any("bias" in p for p in (q, k, v)):
        return w, None
    biases = [p["bias"] if "bias" in p else jnp.zeros(p["weight"].shape[:1], p["weight"].dtype) for p in (q, k, v)]
    return w, jnp.concatenate([biases[0] * scale, biases[1], biases[2]])
