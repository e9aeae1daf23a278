"""Mixture-of-experts decoders of the Llama family: Qwen3-MoE (``Qwen3MoeForCausalLM``: Qwen3-30B-A3B,
Qwen3-235B-A22B, Qwen3-Coder-30B-A3B), Qwen2-MoE (``Qwen2MoeForCausalLM``: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B,
with a gated shared expert beside the routed ones), Mixtral (``MixtralForCausalLM``), Granite-MoE
(``GraniteMoeForCausalLM``: Granite's multipliers, its experts' tensors stacked), OLMoE (``OlmoeForCausalLM``:
OLMoE-1B-7B, OLMo's norm of all the queries and keys) and gpt-oss (``GptOssForCausalLM``: gpt-oss-20b and -120b,
``GptOss``: attention sinks, biases, experts of its own).

Attention, norms, rotary positions and the key/value cache are their dense family's (``models/llama.py``); a
sparse layer's MLP is a router and ``num_experts`` gated MLPs. Each token's router logits go through a softmax,
the ``num_experts_per_tok`` most likely experts run on it (their weights renormalised to sum to one where
``norm_topk_prob``: always for Mixtral), and their outputs are summed by those weights, as Hugging Face's
``*SparseMoeBlock`` computes them. The layers that are sparse: every ``decoder_sparse_step``-th, but those in
``mlp_only_layers`` (dense MLPs of ``intermediate_size``).

How the experts run (``routed``): a token's picks sorted by expert, each expert's picks padded up to a multiple
of a block's rows (8 to 64: ``block_rows``, by how many picks an expert gets on average), and a loop over the
blocks that hold picks, each block one expert's MLP over its rows. Only the experts picked run, each on the
tokens that picked it and at most a block's rows of padding, and the loop's length is the number of blocks
used (a decode step of one token runs ``num_experts_per_tok`` blocks, reading those experts' weights only).
XLA's ``ragged_dot`` would say this in one op, but on the CPU it computes every expert over every row (measured
here: 32 experts, 1024 rows, 46 ms against 41 for the dense product and 1 for one expert's share). Each pick's
weight is applied after the expert's down projection, as Hugging Face's.

Params: a sparse layer holds ``"router": {"weight": [experts, d]}`` and ``"experts": [{"gate", "up":
{"weight": [ff, d]}, "down": {"weight": [d, ff]}}, ...]`` (``ff``: ``moe_intermediate_size``, Mixtral's
``intermediate_size``) in place of ``gate``, ``up`` and ``down``; Qwen2-MoE's adds ``"shared"`` (a gated MLP of
``shared_expert_intermediate_size``) and ``"shared_gate": {"weight": [1, d]}``. The checkpoint's one tensor per
expert is kept as it is; stacking them is weight-only work, done once at load.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ._layers import Params, activation, matmul, normal_init
from .llama import LAYER_TYPES, Granite, Llama, Qwen2, Qwen3

BLOCKS = (8, 16, 32, 64)  # the rows per block ``routed`` picks from (``block_rows``)


def route(logits: jax.Array, k: int, normalize: bool) -> tuple[jax.Array, jax.Array]:
    """Each token's ``k`` experts and their weights from its router ``logits: [n, experts]``: the softmax's ``k``
    largest (in float32), renormalised to sum to one where ``normalize``. Returns (weights ``[n, k]``, experts
    ``[n, k]`` int32)."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, k)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights.astype(logits.dtype), experts.astype(jnp.int32)


def routed(x: jax.Array, weights: jax.Array, picks: jax.Array, gate_up: jax.Array, down: jax.Array, glu: Any,
           biases: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
    """``sum_j weights[t, j] * expert_{picks[t, j]}(x[t])`` for every token ``t`` of ``x: [n, d]``, each expert a
    gated MLP ``down[e] @ glu(gate, up)`` (``act(gate) * up`` for the most) with ``gate_up[e]: [2 ff, d]`` (gate
    rows first) and ``down[e]: [d, ff]`` (``biases``: ``[experts, 2 ff]`` and ``[experts, d]`` added after each,
    gpt-oss's), run on the tokens that picked it only (see the module's docstring), in blocks of ``block_rows``'s
    rows. ``n`` may be symbolic (an exported program): each block size is then a branch, and a profile's
    compile keeps the one its shape picks, as ``_layers.attend_cache`` keeps its window."""
    picks_n, experts = picks.shape[0] * picks.shape[1], gate_up.shape[0]
    if isinstance(picks_n, int):
        return _routed(block_rows(picks_n, experts), glu, x, weights, picks, gate_up, down, biases)
    mean = jnp.asarray(picks_n, jnp.float32) / experts
    which = jnp.sum(2 * mean > jnp.asarray(BLOCKS[:-1], jnp.float32)).astype(jnp.int32)
    return jax.lax.switch(which, [functools.partial(_routed, b, glu) for b in BLOCKS], x, weights, picks, gate_up,
                          down, biases)


def block_rows(picks: int, experts: int) -> int:
    """The rows per block for ``picks`` over ``experts``: the smallest of ``BLOCKS`` that holds twice the picks an
    expert gets on average (the largest past that). A block reads its expert's weights once, so larger blocks read
    them fewer times when many tokens pick each expert, and pad more when few do. Measured here, one layer of
    Qwen3-30B-A3B's shape (128 experts of 768, 8 per token): 128 tokens 223 ms at 8 rows, 169 at 16, 203 at 32;
    1024 tokens 1264 ms at 8, 801 at 16, 571 at 32, 563 at 64, 584 at 128."""
    return next((b for b in BLOCKS if b >= 2 * picks / experts), BLOCKS[-1])


def _routed(block: int, glu: Any, x: jax.Array, weights: jax.Array, picks: jax.Array, gate_up: jax.Array,
            down: jax.Array, biases: tuple[jax.Array, jax.Array] | None) -> jax.Array:
    n, d = x.shape
    experts, k = gate_up.shape[0], picks.shape[1]
    flat = picks.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    expert = flat[order]  # the picks sorted by expert: each pick's token is order // k
    counts = jnp.bincount(flat, length=experts)
    padded = (counts + block - 1) // block * block
    ends = jnp.cumsum(padded)  # each expert's padded rows end here
    firsts = jnp.cumsum(counts) - counts  # where each expert's picks start among the sorted ones
    row = (ends - padded)[expert] + jnp.arange(flat.shape[0]) - firsts[expert]
    rows = flat.shape[0] + experts * (block - 1)  # the most the padded picks can take
    token = jnp.full((rows,), n, jnp.int32).at[row].set((order // k).astype(jnp.int32))  # n: padding
    scale = jnp.zeros((rows,), x.dtype).at[row].set(weights.reshape(-1)[order])
    xs = jnp.concatenate([x, jnp.zeros((1, d), x.dtype)])[token]
    ff = down.shape[2]

    def run(b: jax.Array, out: jax.Array) -> jax.Array:
        at = b * block
        e = jnp.minimum(jnp.searchsorted(ends, at, side="right"), experts - 1)
        h = jax.lax.dynamic_slice_in_dim(xs, at, block)
        gu = jnp.matmul(h, gate_up[e].T) + (0.0 if biases is None else biases[0][e])
        y = jnp.matmul(glu(gu[:, :ff], gu[:, ff:]), down[e].T) + (0.0 if biases is None else biases[1][e])
        return jax.lax.dynamic_update_slice_in_dim(out, y, at, 0)

    ys = jax.lax.fori_loop(0, ends[-1] // block, run, jnp.zeros((rows, d), x.dtype))
    return jnp.zeros((n + 1, d), x.dtype).at[token].add(ys * scale[:, None])[:n]


def check_picks(model: Any) -> None:
    """``num_experts_per_tok`` within ``[1, num_experts]``; ``ValueError`` naming both."""
    if not 0 < model.num_experts_per_tok <= model.num_experts:
        raise ValueError(f"num_experts_per_tok={model.num_experts_per_tok} must be in [1, num_experts="
                         f"{model.num_experts}].")


@dataclass(frozen=True)
class Experts:
    """What a mixture-of-experts config adds to its dense family's (``config.json``'s keys; Qwen3-MoE's defaults).
    A base of ``Qwen3Moe``, ``Qwen2Moe``, ``Mixtral`` and ``Olmoe``, listed first so that its ``init`` and ``_ffn`` come
    before the dense family's."""

    num_experts: int = 128  # routed experts per sparse layer (Mixtral's config: num_local_experts)
    num_experts_per_tok: int = 8  # how many run on each token
    moe_intermediate_size: int | None = 768  # each expert's MLP width (None: intermediate_size, as Mixtral's)
    norm_topk_prob: bool = False  # the picked experts' weights renormalised to sum to one
    decoder_sparse_step: int = 1  # every this-many-th layer is sparse
    mlp_only_layers: tuple[int, ...] = ()  # these layers keep a dense MLP of intermediate_size
    shared_expert_intermediate_size: ClassVar[int | None] = None  # Qwen2-MoE's gated shared expert

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers or ()))
        check_picks(self)
        if self.decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step={self.decoder_sparse_step} must be at least 1.")

    def sparse(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is the experts (Hugging Face's rule)."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    def expert_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def init(self, key: jax.Array) -> Params:
        params = super().init(key)
        d, ff = self.hidden_size, self.expert_size()

        def mlp(k: jax.Array, width: int) -> Params:
            kg, ku, kd = jax.random.split(k, 3)
            return {"gate": {"weight": normal_init(kg, (width, d))}, "up": {"weight": normal_init(ku, (width, d))},
                    "down": {"weight": normal_init(kd, (d, width))}}
        for i, layer in enumerate(params["layers"]):
            if not self.sparse(i):
                continue
            kr, ke, ks, kg = jax.random.split(jax.random.fold_in(key, 1000 + i), 4)
            for name in ("gate", "up", "down"):
                del layer[name]
            layer["router"] = {"weight": normal_init(kr, (self.num_experts, d))}
            layer["experts"] = [mlp(k, ff) for k in jax.random.split(ke, self.num_experts)]
            if self.shared_expert_intermediate_size:
                layer["shared"] = mlp(ks, self.shared_expert_intermediate_size)
                layer["shared_gate"] = {"weight": normal_init(kg, (1, d))}
        return params

    def _ffn(self, p: Params, x: jax.Array) -> jax.Array:
        if "router" not in p:
            return super()._ffn(p, x)
        act = activation(self.hidden_act, "hidden_act")
        flat = x.reshape(-1, x.shape[-1])
        weights, picks = route(matmul(flat, p["router"]["weight"].T), self.num_experts_per_tok,
                               self.norm_topk_prob)
        gate_up = jnp.stack([jnp.concatenate([e["gate"]["weight"], e["up"]["weight"]]) for e in p["experts"]])
        down = jnp.stack([e["down"]["weight"] for e in p["experts"]])
        y = routed(flat, weights, picks, gate_up, down, lambda gate, up: act(gate) * up)
        if "shared" in p:
            shared = super()._ffn(p["shared"], flat)
            y = y + jax.nn.sigmoid(matmul(flat, p["shared_gate"]["weight"].T)) * shared
        return y.reshape(x.shape)


@dataclass(frozen=True)
class Qwen3Moe(Experts, Qwen3):
    """Qwen3-MoE: Qwen3 (queries' and keys' RMSNorm) with routed experts in its sparse layers. Defaults:
    ``Qwen3MoeConfig``'s (Qwen3-30B-A3B's config sets its own: ``norm_topk_prob`` true, ``head_dim`` 128)."""

    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 24
    num_key_value_heads: int | None = 4
    head_dim: int | None = None
    name: ClassVar[str] = "qwen3_moe"


@dataclass(frozen=True)
class Qwen2Moe(Experts, Qwen2):
    """Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2 (biases on the query, key and value projections) whose sparse
    layers add to the routed experts a shared expert, gated per token by a sigmoid. Defaults: ``Qwen2MoeConfig``'s."""

    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_experts: int = 60
    num_experts_per_tok: int = 4
    moe_intermediate_size: int | None = 1408
    shared_expert_intermediate_size: int = 5632
    name: ClassVar[str] = "qwen2_moe"


@dataclass(frozen=True)
class Mixtral(Experts, Llama):
    """Mixtral: Llama whose every MLP is ``num_experts`` experts of ``intermediate_size``, two per token, their
    weights always renormalised. Defaults: ``MixtralConfig``'s (Mixtral-8x7B)."""

    intermediate_size: int = 14336
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool = True
    name: ClassVar[str] = "mixtral"


@dataclass(frozen=True)
class Olmoe(Experts, Llama):
    """OLMoE (``OlmoeForCausalLM``: AllenAI's OLMoE-1B-7B, base and instruct): Llama with an RMSNorm of all the
    queries and of all the keys before they split into heads (OLMo's) and every MLP ``num_experts`` experts of
    ``intermediate_size``, ``num_experts_per_tok`` per token, weighted as the softmax gives them (renormalised only
    where ``norm_topk_prob``). Defaults: ``OlmoeConfig``'s."""

    vocab_size: int = 50304
    hidden_size: int = 2048
    intermediate_size: int = 2048
    num_hidden_layers: int = 16
    num_attention_heads: int = 16
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    num_experts: int = 64
    num_experts_per_tok: int = 8
    moe_intermediate_size: int | None = None
    name: ClassVar[str] = "olmoe"
    qk_norm: ClassVar[str | None] = "all"


@dataclass(frozen=True)
class GraniteMoe(Granite):
    """Granite-MoE (``GraniteMoeForCausalLM``: granite-3.0 and 3.1 1b-a400m and 3b-a800m): Granite (its four
    multipliers) whose every MLP is ``num_experts`` experts of ``intermediate_size``: a router without a bias whose
    ``num_experts_per_tok`` largest logits are softmaxed into the picks' weights (Mixtral's rule), each expert
    ``down(act(gate(x)) * up(x))``. Defaults: ``GraniteMoeConfig``'s.

    Params per layer beside the Llama family's attention: ``"router": {"weight": [experts, d]}``, ``"experts":
    {"gate_up": [experts, 2 ff, d] (gate rows first), "down": [experts, d, ff]}``: the checkpoint's
    ``block_sparse_moe`` tensors as they are (``input_linear``, ``output_linear``), already ``routed``'s layout."""

    num_experts: int = 8  # routed experts per layer (config.json: num_local_experts)
    num_experts_per_tok: int = 2
    name: ClassVar[str] = "granite_moe"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_picks(self)

    def init(self, key: jax.Array) -> Params:
        params = super().init(key)
        d, ff, e = self.hidden_size, self.intermediate_size, self.num_experts
        for i, layer in enumerate(params["layers"]):
            kr, kg, kd = jax.random.split(jax.random.fold_in(key, 1000 + i), 3)
            for name in ("gate", "up", "down"):
                del layer[name]
            layer["router"] = {"weight": normal_init(kr, (e, d))}
            layer["experts"] = {"gate_up": normal_init(kg, (e, 2 * ff, d)), "down": normal_init(kd, (e, d, ff))}
        return params

    def _ffn(self, p: Params, x: jax.Array) -> jax.Array:
        act = activation(self.hidden_act, "hidden_act")
        flat = x.reshape(-1, x.shape[-1])
        weights, picks = route(matmul(flat, p["router"]["weight"].T), self.num_experts_per_tok, True)
        y = routed(flat, weights, picks, p["experts"]["gate_up"], p["experts"]["down"], lambda g, u: act(g) * u)
        return y.reshape(x.shape)


YARN = (("beta_fast", 32.0), ("beta_slow", 1.0), ("factor", 32.0), ("original_max_position_embeddings", 4096),
        ("rope_type", "yarn"), ("truncate", False))  # GptOssConfig's rotary settings where a config has none


@dataclass(frozen=True)
class GptOss(Llama):
    """gpt-oss (``GptOssForCausalLM``: gpt-oss-20b, gpt-oss-120b): the Llama family's attention with biases on every
    projection (the output's too), a learned sink logit per query head that joins each softmax's normalisation
    (``_layers.softmax``), a sliding window in every other layer (the first's; ``layer_types`` where the config names
    them) and YaRN rotary positions; every MLP routed experts: a router with a bias whose ``num_experts_per_tok``
    largest logits are softmaxed into the picks' weights, and experts with biases whose gate and up projections are
    interleaved in one tensor (gate the even features) and joined by a clamped SwiGLU, ``(clip(up, -limit, limit) +
    1) * g * sigmoid(alpha * g)`` with ``g = min(gate, limit)``. Defaults: gpt-oss-20b's.

    Params per layer beside the Llama family's attention (``"o"`` with a bias): ``"sinks": [heads]``, ``"router":
    {"weight": [experts, d], "bias": [experts]}``, ``"experts": {"gate_up": [experts, d, 2 ff], "gate_up_bias":
    [experts, 2 ff], "down": [experts, ff, d], "down_bias": [experts, d]}``, the checkpoint's tensors as they are
    (``routed``'s layout is made from them once, at load)."""

    vocab_size: int = 201088
    hidden_size: int = 2880
    intermediate_size: int = 2880  # each expert's MLP width
    num_hidden_layers: int = 24
    num_attention_heads: int = 64
    num_key_value_heads: int | None = 8
    head_dim: int | None = 64
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    rope_theta: float | None = 150000.0
    attention_bias: bool = True
    sliding_window: int | None = 128
    num_experts: int = 32  # routed experts per layer (config.json: num_local_experts)
    num_experts_per_tok: int = 4
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    name: ClassVar[str] = "gpt_oss"

    def __post_init__(self) -> None:
        if self.rope_parameters is None and self.rope_scaling is None:
            object.__setattr__(self, "rope_parameters", dict(YARN))
        super().__post_init__()
        if not self.attention_bias:
            raise ValueError("attention_bias=false: gpt-oss's projections all have biases, and GptOss reads them.")
        check_picks(self)

    def kinds(self) -> tuple[str, ...]:
        """Without ``layer_types``, Hugging Face's rule for gpt-oss: the window in layers 0, 2, 4, ..."""
        return self.layer_types or tuple(LAYER_TYPES[i % 2 == 0] for i in range(self.num_hidden_layers))

    def init(self, key: jax.Array) -> Params:
        params = super().init(key)
        d, ff, e = self.hidden_size, self.intermediate_size, self.num_experts
        for i, layer in enumerate(params["layers"]):
            ks, kr, kg, kd = jax.random.split(jax.random.fold_in(key, 1000 + i), 4)
            for name in ("gate", "up", "down"):
                del layer[name]
            layer["o"]["bias"] = jnp.zeros((d,), jnp.float32)
            layer["sinks"] = normal_init(ks, (self.heads,))
            layer["router"] = {"weight": normal_init(kr, (e, d)), "bias": jnp.zeros((e,), jnp.float32)}
            layer["experts"] = {"gate_up": normal_init(kg, (e, d, 2 * ff)), "gate_up_bias": jnp.zeros((e, 2 * ff)),
                                "down": normal_init(kd, (e, ff, d)), "down_bias": jnp.zeros((e, d))}
        return params

    def _ffn(self, p: Params, x: jax.Array) -> jax.Array:
        flat = x.reshape(-1, x.shape[-1])
        logits = matmul(flat, p["router"]["weight"].T) + p["router"]["bias"]
        top, picks = jax.lax.top_k(logits, self.num_experts_per_tok)
        weights = jax.nn.softmax(top.astype(jnp.float32), axis=-1).astype(x.dtype)
        ex = p["experts"]

        def split(t: jax.Array) -> jax.Array:  # interleaved gate and up features -> gate's, then up's
            return jnp.concatenate([t[..., ::2], t[..., 1::2]], axis=-1)
        limit, alpha = self.swiglu_limit, self.swiglu_alpha

        def glu(gate: jax.Array, up: jax.Array) -> jax.Array:
            gate = jnp.minimum(gate, limit)
            return (jnp.clip(up, -limit, limit) + 1) * gate * jax.nn.sigmoid(gate * alpha)
        y = routed(flat, weights, picks.astype(jnp.int32), split(ex["gate_up"]).transpose(0, 2, 1),
                   ex["down"].transpose(0, 2, 1), glu, (split(ex["gate_up_bias"]), ex["down_bias"]))
        return y.reshape(x.shape)
