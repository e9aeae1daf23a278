"""SigLIP (Hugging Face's ``SiglipModel`` and its two towers), in plain JAX: CLIP's recipe trained with a sigmoid loss.

As for CLIP (``models/clip.py``), three zoo models: ``SiglipText`` (``model=siglip_text``: ``SiglipTextModel``,
``siglip_text_model``), ``SiglipVision`` (``model=siglip_vision``: ``SiglipVisionModel``, ``siglip_vision_model``) and
``Siglip`` (``model=siglip``: ``SiglipModel``), a tower also read from a whole ``SiglipModel`` checkpoint
(google/siglip-base-patch16-224, siglip-so400m-patch14-384). Defaults are transformers' ``SiglipTextConfig``'s and
``SiglipVisionConfig``'s (siglip-base-patch16-224's sizes). Where it differs from CLIP:

- the text tower attends both ways without a mask, as SigLIP was trained and as its processor calls it: every text is
  padded to ``max_position_embeddings`` (64) tokens (``padding="max_length"``), and the tower pools the last position
  through a Linear of its own (``head``). Its input is ``input_ids: int32 [batch, max_position_embeddings]``, that width
  fixed: a shorter row would be pooled elsewhere;
- the image tower has no class token and no LayerNorm before its layers; its patches' convolution has a bias; it pools
  the states (after ``post_layernorm``) by attention from a learned probe (``head``: ``torch.nn.MultiheadAttention``'s
  fused ``in_proj``, then ``x + MLP(LN(x))``), where ``vision_use_head``;
- ``Siglip``'s ``logits_per_image`` are the cosine similarities times ``exp(logit_scale)`` plus ``logit_bias``, each a
  probability through a sigmoid on its own (``output_scores``): labels do not compete.

Params: the text tower's as ``ClipText``'s without ``projection``, with ``head: Linear [projection_size, d]``; the image
tower's ``{"embeddings": {"patch": {"weight", "bias"}, "position": [patches, d]}, "layers", "post_ln", "head": {"probe":
[1, 1, d], "in_proj": {"weight": [3d, d], "bias": [3d]}, "out_proj": Linear, "ln", "mlp": {"fc1", "fc2"}}}``; the whole
model's ``{"text", "vision", "logit_scale": [1], "logit_bias": [1]}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ._layers import Params, activation, embed, layer_norm, linear, matmul, normal_init, positions, softmax
from .clip import _Image, _Joint, _Tower
from .vit import _linear, _ln, init_layers, patches


@dataclass(frozen=True)
class SiglipText(_Tower):
    vocab_size: int = 32000
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    max_position_embeddings: int = 64  # every text's width: the processor pads to it (padding="max_length")
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    projection_size: int | None = None  # the pooling head's width (null: hidden_size)
    head: str = "auto"  # none (SiglipTextModel); auto: the checkpoint's

    HEADS: ClassVar[tuple[str, ...]] = ("none",)
    name: ClassVar[str] = "siglip_text"
    padding: ClassVar[dict[str, Any]] = {"batch": "rows"}

    def __post_init__(self) -> None:
        self.check()

    @property
    def width(self) -> int:
        return self.projection_size if self.projection_size is not None else self.hidden_size

    def init(self, key: jax.Array) -> Params:
        d = self.hidden_size
        k_tok, k_pos, k_head, *k_layers = jax.random.split(key, 3 + self.num_hidden_layers)
        return {"embeddings": {"token": normal_init(k_tok, (self.vocab_size, d)),
                               "position": normal_init(k_pos, (self.max_position_embeddings, d))},
                "layers": init_layers(k_layers, d, self.intermediate_size), "final_ln": _ln(d),
                "head": _linear(k_head, d, self.width)}

    def tower(self, params: Params, input_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(last_hidden_state, pooler_output)``."""
        emb = params["embeddings"]
        h = embed(emb["token"], input_ids) + positions(emb["position"], input_ids.shape[1])
        h = layer_norm(params["final_ln"], self.layers(params, h), self.layer_norm_eps)
        return h, linear(params["head"], h[:, -1])

    def apply(self, params: Params, input_ids: jax.Array) -> dict[str, jax.Array]:
        h, pooled = self.tower(params, input_ids)
        return {"last_hidden_state": h, "pooler_output": pooled}

    def inputs(self) -> dict[str, list]:
        return {"input_ids": ["batch", self.max_position_embeddings]}

    def input_dtypes(self) -> dict[str, str]:
        return {"input_ids": "int32"}

    def input_values(self) -> dict[str, tuple[int, int]]:
        return {"input_ids": (0, self.vocab_size)}


@dataclass(frozen=True)
class SiglipVision(_Image):
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    vision_use_head: bool = True  # pooler_output by attention from a learned probe; false: no pooler_output
    head: str = "auto"  # none (SiglipVisionModel); auto: the checkpoint's

    HEADS: ClassVar[tuple[str, ...]] = ("none",)
    name: ClassVar[str] = "siglip_vision"
    padding: ClassVar[dict[str, Any]] = {"batch": "rows"}

    def __post_init__(self) -> None:
        self.check()

    def init(self, key: jax.Array) -> Params:
        d, p = self.hidden_size, self.patch_size
        k_patch, k_pos, k_probe, k_in, k_out, k_fc1, k_fc2, *k_layers = jax.random.split(key, 7 + self.num_hidden_layers)
        params = {"embeddings": {"patch": {"weight": normal_init(k_patch, (d, self.num_channels, p, p)),
                                           "bias": jnp.zeros((d,), jnp.float32)},
                                 "position": normal_init(k_pos, (self.grid ** 2, d))},
                  "layers": init_layers(k_layers, d, self.intermediate_size), "post_ln": _ln(d)}
        if self.vision_use_head:
            params["head"] = {"probe": normal_init(k_probe, (1, 1, d)), "in_proj": _linear(k_in, d, 3 * d),
                              "out_proj": _linear(k_out, d, d), "ln": _ln(d),
                              "mlp": {"fc1": _linear(k_fc1, d, self.intermediate_size),
                                      "fc2": _linear(k_fc2, self.intermediate_size, d)}}
        return params

    def pool(self, head: Params, h: jax.Array) -> jax.Array:
        """The probe's attention over the states (one query per image), then ``x + MLP(LN(x))``: ``[b, d]``."""
        b, d, heads = h.shape[0], self.hidden_size, self.num_attention_heads
        w, bias = head["in_proj"]["weight"], head["in_proj"]["bias"]
        q = matmul(head["probe"][0], w[:d].T) + bias[:d]  # [1, d]: the same probe for every image
        kv = matmul(h, w[d:].T) + bias[d:]  # [b, s, 2d]
        k, v = kv[..., :d].reshape(b, -1, heads, d // heads), kv[..., d:].reshape(b, -1, heads, d // heads)
        scores = jnp.einsum("nh,bknh->bnk", q.reshape(heads, d // heads), k) / math.sqrt(d // heads)
        x = linear(head["out_proj"], jnp.einsum("bnk,bknh->bnh", softmax(scores, None, v.dtype), v).reshape(b, d))
        act = activation(self.hidden_act, "hidden_act")
        mlp = head["mlp"]
        return x + linear(mlp["fc2"], act(linear(mlp["fc1"], layer_norm(head["ln"], x, self.layer_norm_eps))))

    def tower(self, params: Params, pixel_values: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """``(last_hidden_state, pooler_output)`` (None without ``vision_use_head``)."""
        emb = params["embeddings"]
        h = self.layers(params, patches(pixel_values, emb["patch"]["weight"]) + emb["patch"]["bias"] + emb["position"])
        h = layer_norm(params["post_ln"], h, self.layer_norm_eps)
        return h, self.pool(params["head"], h) if self.vision_use_head else None

    def apply(self, params: Params, pixel_values: jax.Array) -> dict[str, jax.Array]:
        h, pooled = self.tower(params, pixel_values)
        return {"last_hidden_state": h, **({"pooler_output": pooled} if pooled is not None else {})}


@dataclass(frozen=True)
class Siglip(_Joint):
    """``SiglipModel``: the two towers (their settings ``text_*`` and ``vision_*``, as config.json's ``text_config`` and
    ``vision_config`` hold them) and every image's sigmoid similarity to every text."""

    text_vocab_size: int = 32000
    text_hidden_size: int = 768
    text_intermediate_size: int = 3072
    text_num_hidden_layers: int = 12
    text_num_attention_heads: int = 12
    text_max_position_embeddings: int = 64
    text_hidden_act: str = "gelu_pytorch_tanh"
    text_layer_norm_eps: float = 1e-6
    text_projection_size: int | None = None
    vision_image_size: int = 224
    vision_patch_size: int = 16
    vision_num_channels: int = 3
    vision_hidden_size: int = 768
    vision_intermediate_size: int = 3072
    vision_num_hidden_layers: int = 12
    vision_num_attention_heads: int = 12
    vision_hidden_act: str = "gelu_pytorch_tanh"
    vision_layer_norm_eps: float = 1e-6
    head: str = "auto"  # none (SiglipModel); auto: the checkpoint's

    name: ClassVar[str] = "siglip"
    TOWERS: ClassVar[tuple[type, type]] = (SiglipText, SiglipVision)
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "texts": "rows"}

    def __post_init__(self) -> None:
        self.check_towers()
        if self.text.width != self.vision_hidden_size:
            raise ValueError(f"the text tower's embeddings are {self.text.width} wide (text_projection_size, else "
                             f"text_hidden_size) and the image tower's {self.vision_hidden_size} (vision_hidden_size): "
                             "their similarity needs one width.")

    @property
    def text(self) -> SiglipText:
        return self.tower("text")

    @property
    def vision(self) -> SiglipVision:
        return self.tower("vision")

    def init(self, key: jax.Array) -> Params:
        k_text, k_vision = jax.random.split(key)
        return {"text": self.text.init(k_text), "vision": self.vision.init(k_vision),
                "logit_scale": jnp.zeros((1,), jnp.float32), "logit_bias": jnp.zeros((1,), jnp.float32)}

    def apply(self, params: Params, input_ids: jax.Array, pixel_values: jax.Array) -> dict[str, jax.Array]:
        _, text = self.text.tower(params["text"], input_ids)
        _, image = self.vision.tower(params["vision"], pixel_values)
        return self.similarity(text, image, params["logit_scale"], params["logit_bias"])

    def inputs(self) -> dict[str, list]:
        return {"input_ids": ["texts", self.text_max_position_embeddings], **self.vision.inputs()}

    def output_scores(self) -> dict[str, str]:
        """Each image's similarity to each text a probability on its own (a sigmoid), as SigLIP was trained."""
        return {"logits_per_image": "sigmoid"}
