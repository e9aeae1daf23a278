"""The Llama family (Hugging Face ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``,
``MistralForCausalLM``, ``GraniteForCausalLM``, ``SmolLM3ForCausalLM``, ``GemmaForCausalLM``, ``Gemma2ForCausalLM``,
``Gemma3ForCausalLM``, ``Phi3ForCausalLM``, ``Olmo2ForCausalLM``, ``Olmo3ForCausalLM``), one implementation in plain
JAX: RMSNorm, rotary positions, grouped-query attention, a gated MLP, logits through ``lm_head`` (or the embeddings,
tied).

Fields are the families' ``config.json`` keys, defaults Llama-2-7B's, so a checkpoint's config maps onto the
dataclass by key (``tripy_build.models.hf``). What differs between the families is a setting: Qwen2's q/k/v
biases (``attention_bias``), Qwen3's RMSNorm of each head's queries and keys (``qk_norm``), a sliding window
(Mistral's in every layer; Qwen's from ``max_window_layers`` on, or as ``layer_types`` names each layer's:
``layer_windows``), Llama 3's ``rope_type: llama3`` frequencies; Granite (``Granite``) four scalars on the
embeddings, the scores, the residual branches and the logits; SmolLM3 (``SmolLM3``) layers without rotary
positions; Gemma (``Gemma``) scaled embeddings and ``1 + weight``
norms; Gemma 2 (``Gemma2``) adds norms on the attention's and the MLP's outputs and soft-capped scores and logits;
Gemma 3 (``Gemma3``) queries' and keys' norms and the sliding layers' own rotary frequencies; Phi-3 (``Phi3``)
fused projections, ``longrope`` and ``partial_rotary_factor``; OLMo 2 (``Olmo2``) norms after the attention and
the MLP in place of before them, and of all the queries and keys at once; OLMo 3 (``Olmo3``) sliding windows in
three layers of four, rotated at a base of their own.
``rope_parameters`` is transformers 5's record of the rotary settings; older checkpoints' top-level
``rope_theta`` and ``rope_scaling`` are read into it.

Inputs (int32 ``[batch, seq]``): ``input_ids``, ``attention_mask`` (optional: ones). Outputs by ``head``
(``DECODER_HEADS``, Hugging Face's class-name suffixes): ``causal_lm`` (``*ForCausalLM``) ``{"logits": [batch, seq,
vocab_size]}``; ``none`` (``*Model``) ``{"last_hidden_state": [batch, seq, d]}`` (after the final norm), with
``pooling`` (``mean``, or ``last``: the last real token's, as the decoder embedding models Qwen3-Embedding,
gte-Qwen2 and e5-mistral read it) a ``sentence_embedding`` ``[batch, d]`` too; ``sequence_classification``
(``*ForSequenceClassification``: reward models, classifiers) ``{"logits": [batch, num_labels]}``, the ``score``
Linear of the last real token (the last whose mask is 1 and, where the config has a ``pad_token_id``, that is not
it: Hugging Face's rule); ``token_classification`` ``{"logits": [batch, seq, num_labels]}``; ``question_answering``
(``*ForQuestionAnswering``) ``{"start_logits", "end_logits": [batch, seq]}``. Positions
``0..seq-1``, so padding goes on the right (``seq`` is padded through the mask, as GPT-2's). ``task=generate``
(``causal_lm`` only) drives ``extend`` as it drives GPT-2's (``builder/generate.py``): the cache holds each layer's
keys (after the rotation) and values per key/value head, ``[layers, 2, batch, kv_heads, max_length, head_dim]``.

    h = embed[ids]
    per layer: h = h + O(Attention(rope(Q(RMS1(h))), rope(K(RMS1(h))), V(RMS1(h))))
               h = h + Down(silu(Gate(RMS2(h))) * Up(RMS2(h)))
    logits = RMS_f(h) @ lm_head.T

Params (Hugging Face's layouts, Linear weights ``[out, in]``)::

    {"embed": [vocab, d], "layers": [{"input_norm": [d], "q": {"weight": [h*hd, d], ("bias")}, "k", "v":
     {"weight": [kv*hd, d], ...}, "o": {"weight": [d, h*hd]}, ("q_norm", "k_norm": [hd]), "post_norm": [d],
     "gate", "up": {"weight": [ff, d]}, "down": {"weight": [d, ff]}}, ...], "norm": [d], ("lm_head": [vocab, d]),
     ("score": {"weight": [num_labels or 2, d], ("bias")})}

Gemma's layers add ``"attn_out_norm"`` and ``"mlp_out_norm"`` ([d]; ``"post_norm"`` is its pre-feedforward norm);
OLMo's hold those two in place of ``"input_norm"`` and ``"post_norm"``, its ``"q_norm"`` ``[h*hd]`` and ``"k_norm"``
``[kv*hd]``;
Phi-3's hold ``"qkv": {"weight": [(h + 2kv)*hd, d]}`` and ``"gate_up": {"weight": [2ff, d]}`` instead of q, k, v,
gate and up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ..core.spec import InputInfo
from ._tokens import TokenInputs
from .heads import DecoderHeaded
from ._layers import (ATTENTION_TYPES, Params, activation, attend_cache, cache_step, embed, extend_inputs, head_embed,
                      grouped_attention, head_logits, layer_types, mask_bias, matmul, normal_init, rotate_half, softcap,
                      within_window)

ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")
LAYER_TYPES = ATTENTION_TYPES  # Hugging Face's layer_types: global (every key) and local (a window) layers


def rms_norm(weight: jax.Array, x: jax.Array, eps: float, offset: float = 0.0) -> jax.Array:
    """Hugging Face's RMSNorm: ``x / sqrt(mean(x^2) + eps) * weight`` over the last axis, normalised in float32 and
    returned in ``x``'s dtype. Llama's casts before the scale (``weight * x.to(dtype)``); with ``offset`` (Gemma's
    ``1 + weight``) the scale is applied in float32, as Gemma's is (``1 + w`` in bfloat16 rounds a small ``w``)."""
    y = x.astype(jnp.float32)
    y = y * jax.lax.rsqrt(jnp.mean(jnp.square(y), axis=-1, keepdims=True) + eps)
    if offset:
        return (y * (offset + weight.astype(jnp.float32))).astype(x.dtype)
    return y.astype(x.dtype) * weight


@dataclass(frozen=True)
class Llama(DecoderHeaded, TokenInputs):
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None: as many as the query heads (no grouping)
    head_dim: int | None = None  # None: hidden_size / num_attention_heads
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_parameters: Any = None  # {"rope_type": "default" | "llama3", "rope_theta", and llama3's factors}
    rope_theta: float | None = None  # older checkpoints' keys, read into rope_parameters
    rope_scaling: Any = None
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # a layer with a window sees its last this many positions, its own included
    use_sliding_window: bool = True  # false: no layer has a window (Qwen2/3 configs carry one they do not use)
    max_window_layers: int = 0  # without layer_types: the layers from this one on have the window (Qwen's rule)
    layer_types: tuple[str, ...] = ()  # per layer, full_attention or sliding_attention (() : max_window_layers')
    attn_logit_softcapping: float | None = None  # Gemma 2: scores become cap * tanh(scores / cap)
    final_logit_softcapping: float | None = None  # Gemma 2: the logits, likewise
    head: str = "auto"  # DECODER_HEADS; auto: the checkpoint's (config.json's architectures), causal_lm without one
    num_labels: int = 2  # the classes of a classification head (config.json: id2label's size)
    labels: tuple = ()  # the classes' names, in id order (config.json's id2label; default LABEL_0, LABEL_1, ...)
    problem_type: str | None = None  # a classifier's (config.json's): its scores' function (output_scores); null: by num_labels
    pad_token_id: int | None = None  # sequence_classification: a token with this id is never the one classified
    token_classification_bias: bool = True  # token_classification: whether the score Linear has a bias
    pooling: str = "none"  # none | last | mean: a sentence_embedding output (head none), as sentence-transformers
    normalize: bool = False  # the sentence_embedding scaled to unit length (cosine similarity as a dot product)

    name: ClassVar[str] = "llama"
    # an RMSNorm of the queries and the keys: "head" (each head's, [head_dim]: Qwen3's, Gemma 3's) or "all" (every
    # head's at once, before they split: [heads * head_dim], OLMo's); None: none
    qk_norm: ClassVar[str | None] = None
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}

    def __post_init__(self) -> None:
        rope = dict(self.rope_parameters or self.rope_scaling or {})
        if self.rope_scaling and "type" in self.rope_scaling and "rope_type" not in rope:
            rope["rope_type"] = self.rope_scaling["type"]
        rope.setdefault("rope_type", "default")
        rope.setdefault("rope_theta", self.rope_theta if self.rope_theta is not None else 10000.0)
        if rope["rope_type"] not in ROPE_TYPES:
            raise ValueError(f"rope_type={rope['rope_type']!r} is not supported; supported: {', '.join(ROPE_TYPES)}.")
        rope = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in rope.items()}  # longrope's factors
        object.__setattr__(self, "rope_parameters", tuple(sorted(rope.items())))  # hashable, as every zoo model
        object.__setattr__(self, "rope_scaling", None)
        object.__setattr__(self, "rope_theta", None)
        object.__setattr__(self, "layer_types", layer_types(self.layer_types, self.num_hidden_layers, "the Llama family"))
        if self.heads % self.kv_heads:
            raise ValueError(f"num_attention_heads ({self.heads}) must be a multiple of num_key_value_heads "
                             f"({self.kv_heads}).")
        if self.head_dim is None and self.hidden_size % self.heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({self.heads}) "
                             "where head_dim is not given.")
        activation(self.hidden_act, "hidden_act")
        self.check_heads()
        if self.task != "token_classification":  # read by that head only: dropped under the others, as pad_token_id
            object.__setattr__(self, "token_classification_bias", True)

    @property
    def heads(self) -> int:
        return self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden_size // self.heads

    def init(self, key: jax.Array) -> Params:
        d, ff, hd = self.hidden_size, self.intermediate_size, self.hd

        def lin(k: jax.Array, din: int, dout: int, bias: bool) -> Params:
            return {"weight": normal_init(k, (dout, din)), **({"bias": jnp.zeros((dout,), jnp.float32)} if bias else {})}
        k_embed, k_head, *k_layers = jax.random.split(key, 2 + self.num_hidden_layers)
        layers = []
        for k in k_layers:
            kq, kk, kv, ko, kg, ku, kd = jax.random.split(k, 7)
            layer = {"input_norm": jnp.ones((d,), jnp.float32), "post_norm": jnp.ones((d,), jnp.float32),
                     "q": lin(kq, d, self.heads * hd, self.attention_bias),
                     "k": lin(kk, d, self.kv_heads * hd, self.attention_bias),
                     "v": lin(kv, d, self.kv_heads * hd, self.attention_bias),
                     "o": lin(ko, self.heads * hd, d, False),
                     "gate": lin(kg, d, ff, self.mlp_bias), "up": lin(ku, d, ff, self.mlp_bias),
                     "down": lin(kd, ff, d, self.mlp_bias)}
            if self.qk_norm:
                q_width, k_width = (hd, hd) if self.qk_norm == "head" else (self.heads * hd, self.kv_heads * hd)
                layer.update(q_norm=jnp.ones((q_width,), jnp.float32), k_norm=jnp.ones((k_width,), jnp.float32))
            layers.append(layer)
        params = {"embed": normal_init(k_embed, (self.vocab_size, d)), "layers": layers,
                  "norm": jnp.ones((d,), jnp.float32)}
        if self.task == "causal_lm" and not self.tie_word_embeddings:
            params["lm_head"] = normal_init(k_head, (self.vocab_size, d))
        score = self.score_init(k_head, d, self.token_classification_bias)
        return params if score is None else {**params, "score": score}

    def kinds(self) -> tuple[str, ...]:
        """Each layer's type, as Hugging Face's configs say: ``layer_types``, or (without it) ``sliding_attention``
        from ``max_window_layers`` on where a window is set (every layer of Mistral's)."""
        if self.layer_types:
            return self.layer_types
        slides = bool(self.sliding_window and self.use_sliding_window)
        return tuple(LAYER_TYPES[slides and i >= self.max_window_layers] for i in range(self.num_hidden_layers))

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window (None: it sees every earlier position): ``sliding_window`` in the
        ``sliding_attention`` layers (``kinds``), where ``use_sliding_window``."""
        window = self.sliding_window if self.sliding_window and self.use_sliding_window else None
        return tuple(window if t == "sliding_attention" else None for t in self.kinds())

    # --- pieces ------------------------------------------------------------------------------------
    def layer_rope(self, layer: int) -> dict[str, Any]:
        """The rotary settings of ``layer`` (every layer's the same but for Gemma 3's)."""
        return dict(self.rope_parameters)

    def inv_freq(self, layer: int = 0) -> np.ndarray:
        """The rotary frequencies of ``layer``, ``[rotated / 2]`` (a constant of the program; ``rotated``: the
        head's first ``partial_rotary_factor``): divided by ``factor`` for ``rope_type: linear``, by
        ``short_factor`` for ``longrope`` (the factors Hugging Face takes up to
        ``original_max_position_embeddings``, which bounds such a build: ``max_positions``), Llama 3's scaled
        where asked."""
        rope = self.layer_rope(layer)
        dim = int(self.hd * rope.get("partial_rotary_factor", 1.0))
        inv = 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        if rope["rope_type"] == "linear":
            inv = inv / rope["factor"]
        if rope["rope_type"] == "longrope":
            inv = inv / np.asarray(rope["short_factor"], np.float64)
        if rope["rope_type"] == "yarn":
            inv = self._yarn(inv, dim, rope)
        if rope["rope_type"] == "llama3":
            factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
            old = rope["original_max_position_embeddings"]
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > old / low, inv / factor, inv)
            smooth = (old / wavelen - low) / (high - low)
            medium = (wavelen >= old / high) & (wavelen <= old / low)
            inv = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
        return inv.astype(np.float32)

    def _yarn(self, inv: np.ndarray, dim: int, rope: dict[str, Any]) -> np.ndarray:
        """``rope_type: yarn`` (YaRN, as Hugging Face computes it): each frequency between the original's
        (``inv``) and the original divided by ``factor``, by a ramp over the features from the one that turns
        ``beta_fast`` times within ``original_max_position_embeddings`` to the one that turns ``beta_slow`` times
        (bounds rounded outwards unless ``truncate`` is false)."""
        factor = rope.get("factor") or self.max_position_embeddings / self._original_positions(rope)
        original, base = self._original_positions(rope), rope["rope_theta"]

        def feature(turns: float) -> float:  # the feature that turns ``turns`` times over the original positions
            return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))
        low, high = feature(rope.get("beta_fast") or 32), feature(rope.get("beta_slow") or 1)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / ((high - low) or 0.001), 0, 1)
        return inv / factor * ramp + inv * (1 - ramp)

    def _original_positions(self, rope: dict[str, Any]) -> int:
        return rope.get("original_max_position_embeddings") or self.max_position_embeddings

    def attention_factor(self, layer: int = 0) -> float:
        """What ``longrope`` and ``yarn`` scale the rotation's cos and sin by (``attention_factor``, else Hugging
        Face's default from ``factor``: YaRN's ``0.1 ln(factor) + 1``, or the ratio of two such by ``mscale`` and
        ``mscale_all_dim``); 1 for the others."""
        rope = self.layer_rope(layer)
        if rope["rope_type"] == "yarn":
            factor = rope.get("factor") or self.max_position_embeddings / self._original_positions(rope)

            def mscale(m: float = 1.0) -> float:
                return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0
            if rope.get("attention_factor") is not None:
                return float(rope["attention_factor"])
            if rope.get("mscale") and rope.get("mscale_all_dim"):
                return mscale(rope["mscale"]) / mscale(rope["mscale_all_dim"])
            return mscale()
        if rope["rope_type"] != "longrope":
            return 1.0
        original = rope.get("original_max_position_embeddings") or self.max_position_embeddings
        factor = rope.get("factor") or self.max_position_embeddings / original
        default = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
        return float(rope.get("attention_factor") or default)

    def _rope(self, x: jax.Array, position_ids: jax.Array, layer: int) -> jax.Array:
        """``x: [n, s, heads, hd]`` rotated by each token's position (``position_ids: [n, s]`` or ``[s]``), its
        first ``2 * len(inv_freq)`` features (all but where ``partial_rotary_factor`` < 1)."""
        inv = self.inv_freq(layer)
        freqs = position_ids.astype(jnp.float32)[..., None] * jnp.asarray(inv)
        angles = jnp.concatenate([freqs, freqs], axis=-1)
        scale = self.attention_factor(layer)
        cos, sin = (jnp.cos(angles) * scale).astype(x.dtype), (jnp.sin(angles) * scale).astype(x.dtype)
        if position_ids.ndim == 1:
            cos, sin = cos[None], sin[None]
        rot, rest = x[..., :2 * inv.size], x[..., 2 * inv.size:]
        return jnp.concatenate([rot * cos[:, :, None, :] + rotate_half(rot) * sin[:, :, None, :], rest], axis=-1)

    def _qkv(self, p: Params, x: jax.Array, position_ids: jax.Array,
             layer: int) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``layer``'s queries ``[n, s, heads, hd]`` (rotated and scaled), keys ``[n, s, kv, hd]`` (rotated) and
        values."""
        n, s, _ = x.shape
        hd = self.hd

        def proj(lin: Params, heads: int, norm: jax.Array | None = None) -> jax.Array:
            y = matmul(x, lin["weight"].T) + (lin["bias"] if "bias" in lin else 0.0)
            if norm is not None and self.qk_norm == "all":
                y = self._norm(norm, y)
            y = y.reshape(n, s, heads, hd)
            return self._norm(norm, y) if norm is not None and self.qk_norm == "head" else y
        q, k = proj(p["q"], self.heads, p.get("q_norm")), proj(p["k"], self.kv_heads, p.get("k_norm"))
        v = proj(p["v"], self.kv_heads)
        return self._rope(q, position_ids, layer) * self._query_scale(), self._rope(k, position_ids, layer), v

    def _query_scale(self) -> float:
        return 1.0 / math.sqrt(self.hd)

    def _norm(self, weight: jax.Array, x: jax.Array) -> jax.Array:
        return rms_norm(weight, x, self.rms_norm_eps)

    def _layer_input(self, p: Params, h: jax.Array) -> jax.Array:
        """What a layer's attention reads of the residual stream ``h``: its input norm's output."""
        return self._norm(p["input_norm"], h)

    def _attended(self, p: Params, h: jax.Array, ctx: jax.Array) -> jax.Array:
        """The residual stream after a layer's attention: ``h`` plus the output projection of ``ctx``."""
        return h + self._projected(p, ctx)

    def _projected(self, p: Params, ctx: jax.Array) -> jax.Array:
        """The attention's output projection of ``ctx`` (and its bias, where the layer has one: gpt-oss's)."""
        return matmul(ctx, p["o"]["weight"].T) + (p["o"]["bias"] if "bias" in p["o"] else 0.0)

    def _sinks(self, p: Params) -> jax.Array | None:
        """A layer's attention sinks (``_layers.softmax``): gpt-oss's; none in the others."""
        return p.get("sinks")

    def _ffn(self, p: Params, x: jax.Array) -> jax.Array:
        """The gated MLP: ``down(act(gate(x)) * up(x))``."""
        act = activation(self.hidden_act, "hidden_act")

        def lin(q: Params, y: jax.Array) -> jax.Array:
            return matmul(y, q["weight"].T) + (q["bias"] if "bias" in q else 0.0)
        return lin(p["down"], act(lin(p["gate"], x)) * lin(p["up"], x))

    def _mlp(self, p: Params, h: jax.Array) -> jax.Array:
        return h + self._ffn(p, self._norm(p["post_norm"], h))

    def _embed(self, params: Params, input_ids: jax.Array) -> jax.Array:
        """The inputs' embeddings: read from the output projection's copy of the table (``head_embed``) where the
        LM head is tied to them, so that only that copy is held."""
        if "lm_head" in params or self.task != "causal_lm":
            return embed(params["embed"], input_ids)
        return head_embed(params["embed"], input_ids)

    def _logits(self, params: Params, h: jax.Array) -> jax.Array:
        """The output projection: ``lm_head`` (or the tied embeddings), in ``head_logits``' layout."""
        table = params["lm_head"] if "lm_head" in params else params["embed"]
        return softcap(head_logits(self._norm(params["norm"], h), table), self.final_logit_softcapping)

    # --- the forward pass --------------------------------------------------------------------------
    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        b, s = input_ids.shape
        h = self._embed(params, input_ids)
        pos = jnp.arange(s)
        keep = (pos[:, None] >= pos[None, :])[None, None] & (attention_mask != 0)[:, None, None, :]
        biases = {w: mask_bias(within_window(keep, pos, w), h.dtype) for w in dict.fromkeys(self.layer_windows())}
        for i, (p, window) in enumerate(zip(params["layers"], self.layer_windows())):
            q, k, v = self._qkv(p, self._layer_input(p, h), pos, i)
            ctx = grouped_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), biases[window],
                                    self.attn_logit_softcapping, self._sinks(p))
            h = self._mlp(p, self._attended(p, h, ctx.reshape(b, s, self.heads * self.hd)))
        return self._outputs(params, h, input_ids, attention_mask)

    def _outputs(self, params: Params, h: jax.Array, input_ids: jax.Array,
                 attention_mask: jax.Array) -> dict[str, jax.Array]:
        """The head's outputs from the last layer's states ``h: [b, s, d]`` (see the module's docstring)."""
        if self.task == "causal_lm":
            return {"logits": self._logits(params, h)}
        return self.head_outputs(params.get("score"), self._norm(params["norm"], h), input_ids, attention_mask)

    def max_positions(self) -> int:
        """The longest sequence served: the position range trained (``max_position_embeddings``); with
        ``longrope``, ``original_max_position_embeddings``: beyond it Hugging Face switches each call to the long
        factors by that call's own length, which a chunked prefill and a cache of keys rotated the other way
        cannot follow, so a longer build is refused rather than served with other values."""
        rope = dict(self.rope_parameters)
        if rope["rope_type"] == "longrope" and rope.get("original_max_position_embeddings"):
            return min(self.max_position_embeddings, int(rope["original_max_position_embeddings"]))
        return self.max_position_embeddings

    def positions_limit(self) -> str | None:
        """Why ``max_positions`` is below the position table, in the build's refusal (None: it is the table)."""
        if self.max_positions() == self.max_position_embeddings:
            return None
        return (f"{type(self).__name__} serves {self.max_positions()} positions: rope_type longrope's "
                f"original_max_position_embeddings (Hugging Face changes its rotary factors beyond it, by each "
                f"call's length, which a build cannot follow)")

    # --- generation: a key/value cache extended in place (builder/generate.py) --------------------------
    def cache_shape(self, batch: Any, max_length: int) -> tuple[Any, ...]:
        """``[layers, 2 (keys, values), batch, kv_heads, max_length, head_dim]``: keys stored rotated."""
        return (self.num_hidden_layers, 2, batch, self.kv_heads, max_length, self.hd)

    def extend_inputs(self, batch: Any, seq: Any, max_length: int, one_row: bool,
                      cache_dtype: str = "float32") -> dict[str, InputInfo]:
        """As GPT-2's (``models/gpt2.py``): new tokens for every row, or for the one ``row`` names."""
        return extend_inputs(self.vocab_size, self.max_positions(), self.cache_shape, batch, seq, max_length, one_row,
                             cache_dtype)

    def extend(self, params: Params, input_ids: jax.Array, position_ids: jax.Array, attention_mask: jax.Array,
               cache: jax.Array, cache_index: jax.Array, row: jax.Array | None = None) -> dict[str, jax.Array]:
        """``s`` new tokens per row against the cache, their keys and values written into it, the logits of each
        row's last new token: GPT-2's ``extend`` (its docstring says how prefill and decode use it), with rotary
        positions and key/value heads shared by groups of query heads."""
        n, s = input_ids.shape
        h = self._embed(params, input_ids)
        rows, query_at, keep, windows = cache_step(attention_mask, cache_index, n, s, row)
        biases = {w: mask_bias(within_window(keep, query_at[:, None], w), h.dtype) for w in dict.fromkeys(self.layer_windows())}
        for i, (p, window) in enumerate(zip(params["layers"], self.layer_windows())):
            q, k, v = self._qkv(p, self._layer_input(p, h), position_ids, i)
            for kind, new in ((0, k), (1, v)):  # [n, s, kv, hd] into the donated cache, in place
                cache = cache.at[i, kind, rows[:, None], :, query_at, :].set(new.astype(cache.dtype))

            def read(kind: int, size: int, cache=cache, i=i) -> jax.Array:  # [n, kv_heads, size, hd]
                part = cache[i, kind, :, :, :size]
                return part if row is None else jax.lax.dynamic_slice_in_dim(part, row[0], 1, axis=0)
            ctx = attend_cache(q, read, biases[window], query_at, windows, self.attn_logit_softcapping,
                               self._sinks(p))
            h = self._mlp(p, self._attended(p, h, ctx.reshape(n, s, self.heads * self.hd)))
        return {"logits": self._logits(params, h[:, -1]), "cache": cache}


@dataclass(frozen=True)
class Qwen2(Llama):
    """Qwen2 / Qwen2.5: Llama with biases on the query, key and value projections."""

    vocab_size: int = 151936
    attention_bias: bool = True
    use_sliding_window: bool = False
    max_window_layers: int = 28
    name: ClassVar[str] = "qwen2"


@dataclass(frozen=True)
class Qwen3(Llama):
    """Qwen3: Llama with an RMSNorm of each head's queries and keys (before the rotation)."""

    vocab_size: int = 151936
    head_dim: int | None = 128
    use_sliding_window: bool = False
    max_window_layers: int = 28
    name: ClassVar[str] = "qwen3"
    qk_norm: ClassVar[str | None] = "head"


@dataclass(frozen=True)
class Mistral(Llama):
    """Mistral: Llama with a sliding window in every layer (4096 for Mistral-7B-v0.1; null from v0.2 on)."""

    max_position_embeddings: int = 32768
    sliding_window: int | None = 4096
    name: ClassVar[str] = "mistral"


@dataclass(frozen=True)
class Granite(Llama):
    """IBM's Granite 3 dense models (``GraniteForCausalLM``: granite-3.x-2b and -8b, base and instruct): Llama with
    four scalars: the embeddings scaled by ``embedding_multiplier``, the attention's scores by
    ``attention_multiplier`` (in place of ``1 / sqrt(head_dim)``), each layer's attention and MLP outputs by
    ``residual_multiplier`` before they join the residual stream, and the logits divided by ``logits_scaling``."""

    embedding_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    name: ClassVar[str] = "granite"

    def _embed(self, params: Params, input_ids: jax.Array) -> jax.Array:
        return super()._embed(params, input_ids) * self.embedding_multiplier

    def _query_scale(self) -> float:
        return self.attention_multiplier

    def _attended(self, p: Params, h: jax.Array, ctx: jax.Array) -> jax.Array:
        return h + self._projected(p, ctx) * self.residual_multiplier

    def _mlp(self, p: Params, h: jax.Array) -> jax.Array:
        return h + self._ffn(p, self._norm(p["post_norm"], h)) * self.residual_multiplier

    def _logits(self, params: Params, h: jax.Array) -> jax.Array:
        return super()._logits(params, h) / self.logits_scaling


@dataclass(frozen=True)
class SmolLM3(Llama):
    """SmolLM3 (``SmolLM3ForCausalLM``: SmolLM3-3B, base and its hybrid reasoning instruct model): Llama whose
    layers listed 0 in ``no_rope_layers`` have no rotary positions (NoPE: by default every
    ``no_rope_layer_interval``-th); where a window is asked (``use_sliding_window``), it is those layers' unless
    ``layer_types`` names others, as transformers sets them. Embeddings tied. Defaults: SmolLM3-3B's."""

    vocab_size: int = 128256
    hidden_size: int = 2048
    intermediate_size: int = 11008
    num_hidden_layers: int = 36
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 4
    max_position_embeddings: int = 32768
    use_sliding_window: bool = False
    tie_word_embeddings: bool = True
    no_rope_layers: tuple[int, ...] = ()  # per layer: 1 rotary positions, 0 none (() : no_rope_layer_interval's)
    no_rope_layer_interval: int = 4
    name: ClassVar[str] = "smollm3"

    def __post_init__(self) -> None:
        layers = self.num_hidden_layers
        rotated = tuple(int(x) for x in self.no_rope_layers or
                        (int((i + 1) % self.no_rope_layer_interval != 0) for i in range(layers)))
        if len(rotated) != layers or set(rotated) - {0, 1}:
            raise ValueError(f"no_rope_layers={list(rotated)}: one 0 (no rotary positions) or 1 per layer, "
                             f"{layers} of them.")
        object.__setattr__(self, "no_rope_layers", rotated)
        if not self.layer_types:
            windowed = self.use_sliding_window and self.sliding_window is not None
            object.__setattr__(self, "layer_types", tuple(LAYER_TYPES[windowed and not r] for r in rotated))
        super().__post_init__()

    def _rope(self, x: jax.Array, position_ids: jax.Array, layer: int) -> jax.Array:
        return super()._rope(x, position_ids, layer) if self.no_rope_layers[layer] else x


@dataclass(frozen=True)
class Gemma(Llama):
    """Gemma (``GemmaForCausalLM``: gemma-2b and -7b, gemma-1.1, CodeGemma): the Llama family's attention and gated
    MLP (``gelu_pytorch_tanh``: the first releases' ``hidden_act: gelu`` means it, as transformers reads it), with
    norms that scale by ``1 + weight`` and embeddings scaled by ``sqrt(hidden_size)`` (in the embeddings' dtype,
    as Gemma's). Embeddings tied. Defaults: ``GemmaConfig``'s (gemma-7b's)."""

    vocab_size: int = 256000
    hidden_size: int = 3072
    intermediate_size: int = 24576
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 16
    head_dim: int | None = 256
    hidden_act: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True
    name: ClassVar[str] = "gemma"
    legacy_gelu: ClassVar[bool] = True  # hidden_act: gelu is read as the tanh approximation (Gemma 1's configs only)

    def __post_init__(self) -> None:
        if self.legacy_gelu and self.hidden_act == "gelu":
            object.__setattr__(self, "hidden_act", "gelu_pytorch_tanh")
        super().__post_init__()

    def init(self, key: jax.Array) -> Params:
        params = super().init(key)
        zeros = jnp.zeros((self.hidden_size,), jnp.float32)  # a norm scales by 1 + weight
        params["norm"] = zeros
        params["layers"] = [{**p, "input_norm": zeros, "post_norm": zeros} for p in params["layers"]]
        return params

    def _norm(self, weight: jax.Array, x: jax.Array) -> jax.Array:
        return rms_norm(weight, x, self.rms_norm_eps, offset=1.0)

    def _embed(self, params: Params, input_ids: jax.Array) -> jax.Array:
        h = super()._embed(params, input_ids)
        return h * jnp.asarray(math.sqrt(self.hidden_size), h.dtype)


@dataclass(frozen=True)
class Gemma2(Gemma):
    """Gemma 2: Gemma's layer with an RMSNorm on the attention's output and around the MLP's (four per layer),
    queries scaled by ``query_pre_attn_scalar ** -0.5``, scores and logits soft-capped (``cap * tanh(x / cap)``),
    and a sliding window in every other layer (the first one's; ``layer_types`` where the config names them).
    Defaults: gemma-2-2b's."""

    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int | None = 4
    query_pre_attn_scalar: float = 256
    sliding_window: int | None = 4096
    attn_logit_softcapping: float | None = 50.0
    final_logit_softcapping: float | None = 30.0
    name: ClassVar[str] = "gemma2"
    legacy_gelu: ClassVar[bool] = False

    def init(self, key: jax.Array) -> Params:
        params = super().init(key)
        zeros = jnp.zeros((self.hidden_size,), jnp.float32)  # a norm scales by 1 + weight
        params["layers"] = [{**p, "attn_out_norm": zeros, "mlp_out_norm": zeros} for p in params["layers"]]
        return params

    def kinds(self) -> tuple[str, ...]:
        """Without ``layer_types``, Hugging Face's rule for Gemma 2: the window in layers 0, 2, 4, ..."""
        return self.layer_types or tuple(LAYER_TYPES[i % 2 == 0] for i in range(self.num_hidden_layers))

    def _query_scale(self) -> float:
        return float(self.query_pre_attn_scalar) ** -0.5

    def _attended(self, p: Params, h: jax.Array, ctx: jax.Array) -> jax.Array:
        return h + self._norm(p["attn_out_norm"], self._projected(p, ctx))

    def _mlp(self, p: Params, h: jax.Array) -> jax.Array:
        return h + self._norm(p["mlp_out_norm"], self._ffn(p, self._norm(p["post_norm"], h)))


class LocalRope:
    """Sliding layers with rotary frequencies of their own (Gemma 3's, OLMo 3's): the dataclass has
    ``rope_local_base_freq`` (their base, ``rope_type: default``), and ``rope_parameters`` are the global layers'.
    transformers 5 saves the two as ``rope_parameters: {full_attention: ..., sliding_attention: ...}``, read apart
    here before the family's ``__post_init__`` reads ``rope_parameters``."""

    def split_rope(self) -> None:
        rope = dict(self.rope_parameters or {})
        if "full_attention" in rope or "sliding_attention" in rope:
            local = dict(rope.get("sliding_attention") or {})
            if local.get("rope_type", "default") != "default":
                raise ValueError(f"rope_parameters.sliding_attention: rope_type={local['rope_type']!r}; "
                                 f"{type(self).__name__}'s sliding layers implement rope_type default only.")
            theta = local.get("rope_theta", self.rope_local_base_freq)
            object.__setattr__(self, "rope_local_base_freq", None if theta is None else float(theta))
            object.__setattr__(self, "rope_parameters", rope.get("full_attention") or None)

    def layer_rope(self, layer: int) -> dict[str, Any]:
        if self.kinds()[layer] == "sliding_attention":
            return {"rope_type": "default", "rope_theta": self.rope_local_base_freq}
        return super().layer_rope(layer)


@dataclass(frozen=True)
class Gemma3(LocalRope, Gemma2):
    """Gemma 3's text model (``Gemma3ForCausalLM``, ``model_type: gemma3_text``: gemma-3-270m and 1b): Gemma 2's
    layer with a ``1 + weight`` RMSNorm of each head's queries and keys, no soft caps, five sliding layers to
    each global one (``sliding_window_pattern``; ``layer_types`` where the config names them), and rotary
    frequencies of their own in the sliding layers (``rope_local_base_freq``); ``rope_parameters`` (or older
    configs' ``rope_scaling``, ``rope_theta``) are the global layers'. Defaults: gemma-3-1b's."""

    vocab_size: int = 262144
    hidden_size: int = 1152
    intermediate_size: int = 6912
    num_attention_heads: int = 4
    num_key_value_heads: int | None = 1
    max_position_embeddings: int = 32768
    sliding_window: int | None = 512
    rope_theta: float | None = 1000000.0
    rope_local_base_freq: float = 10000.0
    sliding_window_pattern: int = 6
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    name: ClassVar[str] = "gemma3"
    qk_norm: ClassVar[str | None] = "head"

    def __post_init__(self) -> None:
        self.split_rope()
        super().__post_init__()

    def init(self, key: jax.Array) -> Params:
        params = super().init(key)
        zeros = jnp.zeros((self.hd,), jnp.float32)
        params["layers"] = [{**p, "q_norm": zeros, "k_norm": zeros} for p in params["layers"]]
        return params

    def kinds(self) -> tuple[str, ...]:
        """Without ``layer_types``: every ``sliding_window_pattern``-th layer global, the others sliding."""
        pattern = self.sliding_window_pattern
        return self.layer_types or tuple(LAYER_TYPES[bool((i + 1) % pattern)] for i in range(self.num_hidden_layers))


@dataclass(frozen=True)
class Phi3(Llama):
    """Phi-3 (``Phi3ForCausalLM``: Phi-3-mini, Phi-3.5-mini, Phi-4-mini): the Llama family with the query, key
    and value projections fused into one (``qkv``, split after the product) and the MLP's gate and up ones
    (``gate_up``), rotary ``longrope`` (``short_factor`` up to ``original_max_position_embeddings``) and a rotated
    fraction of each head (``partial_rotary_factor``). Defaults: Phi-3-mini-4k's (its window, 2047)."""

    vocab_size: int = 32064
    hidden_size: int = 3072
    intermediate_size: int = 8192
    num_attention_heads: int = 32
    max_position_embeddings: int = 4096
    original_max_position_embeddings: int | None = None  # longrope's: read into rope_parameters
    partial_rotary_factor: float | None = None  # older configs' top-level key: read into rope_parameters
    rms_norm_eps: float = 1e-5
    sliding_window: int | None = 2047
    name: ClassVar[str] = "phi3"

    def __post_init__(self) -> None:
        for field in ("rope_parameters", "rope_scaling"):  # Phi-3's first configs named longrope su (or yarn)
            rope = getattr(self, field)
            if isinstance(rope, Mapping) and (rope.get("rope_type") or rope.get("type")) in ("su", "yarn"):
                object.__setattr__(self, field, {**rope, "rope_type": "longrope", "type": "longrope"})
        super().__post_init__()
        rope = dict(self.rope_parameters)
        for key in ("original_max_position_embeddings", "partial_rotary_factor"):
            if getattr(self, key) is not None:
                rope.setdefault(key, getattr(self, key))
        if rope["rope_type"] == "longrope":
            half = int(self.hd * rope.get("partial_rotary_factor", 1.0)) // 2
            if len(rope.get("short_factor") or ()) != half:
                raise ValueError(f"rope_parameters.short_factor holds {len(rope.get('short_factor') or ())} factors; "
                                 f"longrope needs one per rotated pair of the head's features ({half}).")
        object.__setattr__(self, "rope_parameters", tuple(sorted(rope.items())))

    def init(self, key: jax.Array) -> Params:
        params = super().init(key)
        params["layers"] = [{**{k: v for k, v in p.items() if k not in ("q", "k", "v", "gate", "up")},
                             "qkv": {"weight": jnp.concatenate([p["q"]["weight"], p["k"]["weight"], p["v"]["weight"]])},
                             "gate_up": {"weight": jnp.concatenate([p["gate"]["weight"], p["up"]["weight"]])}}
                            for p in params["layers"]]
        return params

    def _qkv(self, p: Params, x: jax.Array, position_ids: jax.Array,
             layer: int) -> tuple[jax.Array, jax.Array, jax.Array]:
        n, s, _ = x.shape
        hd, q_size, kv_size = self.hd, self.heads * self.hd, self.kv_heads * self.hd
        y = matmul(x, p["qkv"]["weight"].T)
        q = y[..., :q_size].reshape(n, s, self.heads, hd)
        k = y[..., q_size:q_size + kv_size].reshape(n, s, self.kv_heads, hd)
        v = y[..., q_size + kv_size:].reshape(n, s, self.kv_heads, hd)
        return self._rope(q, position_ids, layer) * self._query_scale(), self._rope(k, position_ids, layer), v

    def _ffn(self, p: Params, x: jax.Array) -> jax.Array:
        gate, up = jnp.split(matmul(x, p["gate_up"]["weight"].T), 2, axis=-1)
        return matmul(activation(self.hidden_act, "hidden_act")(gate) * up, p["down"]["weight"].T)


@dataclass(frozen=True)
class Olmo2(Llama):
    """OLMo 2 (``Olmo2ForCausalLM``: AllenAI's OLMo-2 1B, 7B, 13B and 32B, base, instruct and reward models): the
    Llama family's attention and gated MLP with the norms after the branches (RMSNorms of the attention's output,
    ``post_attention_layernorm``, and of the MLP's, ``post_feedforward_layernorm``, before each joins the residual
    stream; no norm of a layer's input) and an RMSNorm of all the queries and of all the keys before they split
    into heads. As OLMo's, the norms scale in float32 and the rotation is computed in float32, each cast back
    after. Defaults: ``Olmo2Config``'s."""

    vocab_size: int = 50304
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    name: ClassVar[str] = "olmo2"
    qk_norm: ClassVar[str | None] = "all"

    def init(self, key: jax.Array) -> Params:
        params = super().init(key)
        ones = jnp.ones((self.hidden_size,), jnp.float32)
        params["layers"] = [{**{k: v for k, v in p.items() if k not in ("input_norm", "post_norm")},
                             "attn_out_norm": ones, "mlp_out_norm": ones} for p in params["layers"]]
        return params

    def _norm(self, weight: jax.Array, x: jax.Array) -> jax.Array:
        return rms_norm(weight, x.astype(jnp.float32), self.rms_norm_eps).astype(x.dtype)

    def _rope(self, x: jax.Array, position_ids: jax.Array, layer: int) -> jax.Array:
        return super()._rope(x.astype(jnp.float32), position_ids, layer).astype(x.dtype)

    def _layer_input(self, p: Params, h: jax.Array) -> jax.Array:
        return h

    def _attended(self, p: Params, h: jax.Array, ctx: jax.Array) -> jax.Array:
        return h + self._norm(p["attn_out_norm"], self._projected(p, ctx))

    def _mlp(self, p: Params, h: jax.Array) -> jax.Array:
        return h + self._norm(p["mlp_out_norm"], self._ffn(p, h))


@dataclass(frozen=True)
class Olmo3(LocalRope, Olmo2):
    """OLMo 3 (``Olmo3ForCausalLM``: OLMo-3 7B and 32B, base, instruct and thinking models): OLMo 2's layer with a
    sliding window in three layers of four (``layer_types`` where the config names them), the sliding layers
    rotated at ``rope_local_base_freq`` and the global ones by ``rope_parameters`` (OLMo-3's long-context YaRN is
    the global layers' only). Older configs' ``rope_theta`` is every layer's base (where ``rope_local_base_freq``
    is not set), their ``rope_scaling`` the global layers', as transformers reads them. Defaults: ``Olmo3Config``'s."""

    rope_theta: float | None = 500000.0
    rope_local_base_freq: float | None = None  # the sliding layers' rotary base (None: the global layers' base)
    sliding_window: int | None = 4096
    name: ClassVar[str] = "olmo3"

    def __post_init__(self) -> None:
        self.split_rope()
        if self.rope_local_base_freq is None:
            theta = dict(self.rope_parameters or {}).get("rope_theta", self.rope_theta)
            object.__setattr__(self, "rope_local_base_freq", float(theta))
        super().__post_init__()

    def kinds(self) -> tuple[str, ...]:
        """Without ``layer_types``: every fourth layer global, the others sliding (transformers' rule)."""
        return self.layer_types or tuple(LAYER_TYPES[bool((i + 1) % 4)] for i in range(self.num_hidden_layers))
