"""CLIP (Hugging Face's ``CLIPModel`` and its two towers), in plain JAX.

Three zoo models, as transformers has three configs: ``ClipText`` (``model=clip_text``: ``CLIPTextModel`` and
``CLIPTextModelWithProjection``, model type ``clip_text_model``), ``ClipVision`` (``model=clip_vision``:
``CLIPVisionModel`` and ``CLIPVisionModelWithProjection``, ``clip_vision_model``) and ``Clip`` (``model=clip``:
``CLIPModel``, both towers and the image-text similarity, ``clip``). A tower also reads a whole ``CLIPModel``
checkpoint (openai/clip-vit-base-patch32): its own half of the config and tensors, with the projection, the other
tower's tensors skipped and said (``hf.Architecture.parts``): the text tower alone for a search index's queries, the
image tower alone for its images. Defaults are transformers' ``CLIPTextConfig``'s and ``CLIPVisionConfig``'s (ViT-B/32's
sizes), so a ``config.json`` that leaves a key out is read as transformers reads it.

Text tower, input ``input_ids``, ``attention_mask: int32 [batch, seq]`` (``seq`` at most ``max_position_embeddings``,
77)::

    h = Token(input_ids) + Position(0..seq-1)
    per layer (pre-LN, causal and the padding mask): h = h + Out(Attention(LN1(h)));  h = h + fc2(act(fc1(LN2(h))))
    last_hidden_state = LN_final(h);  pooler_output = last_hidden_state at each row's end of text

The end of text is each row's first ``eos_token_id``; a config whose ``eos_token_id`` is 2 (CLIP's configs before
transformers' PR #24773) pools at each row's largest id instead, as transformers does. Where a row must hold
``eos_token_id`` (the first rule), a call whose row lacks it is refused (``InputInfo.holds``): transformers would
pool at position 0 without a word.

Image tower, input ``pixel_values: float32 [batch, num_channels, image_size, image_size]`` (NCHW, as the
processor makes them)::

    h = [class | Patches(pixel_values)] + Position      # Patches: a p x p, stride p convolution without bias
    h = LN_pre(h); the same layers, unmasked;  last_hidden_state = h;  pooler_output = LN_post(h[:, 0])

Heads: a tower's ``none`` gives ``last_hidden_state`` and ``pooler_output``; ``projection`` (``*WithProjection``)
``text_embeds`` / ``image_embeds`` (the pooled state times the projection, not normalized) and ``last_hidden_state``.
``Clip``: ``logits_per_image [batch, texts]`` (cosine similarity times ``exp(logit_scale)``), ``logits_per_text``
(its transpose), and both embeddings normalized, as ``CLIPModel`` returns them; its texts are the ``texts`` dim,
its images ``batch``.

Params (Hugging Face's layouts, Linear weights ``[out, in]``; a layer as ``vit.init_layers``')::

    text:   {"embeddings": {"token": [vocab, d], "position": [max_position_embeddings, d]},
             "layers": [...], "final_ln": {"scale", "bias"}, "projection": [projection_dim, d]}  # head projection
    vision: {"embeddings": {"cls": [d], "patch": [d, num_channels, p, p], "position": [1 + patches, d]},
             "pre_ln", "layers": [...], "post_ln", "projection": [projection_dim, d]}
    clip:   {"text": text's, "vision": vision's (each without "projection"), "text_projection", "visual_projection",
             "logit_scale": []}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ._layers import Params, activation, embed, layer_norm, mask_bias, matmul, normal_init, positions
from ._tokens import TokenInputs
from .vit import _ln, encode, init_layers, patches

LEGACY_EOS = 2  # transformers pools at each row's largest id where a config's eos_token_id is 2 (before PR #24773)
TOWER_HEADS = ("none", "projection")


class _Tower:
    """What both towers share: a head (``none`` | ``projection``) and the checks of their sizes."""

    HEADS: ClassVar[tuple[str, ...]] = TOWER_HEADS

    @property
    def task(self) -> str:
        return "none" if self.head == "auto" else self.head

    def check(self) -> None:
        if self.head != "auto" and self.head not in self.HEADS:
            projection = " (projection: the *WithProjection model's embeddings)" if "projection" in self.HEADS else ""
            raise ValueError(f"head={self.head!r} is not a head of {type(self).__name__}; one of auto, "
                             f"{', '.join(self.HEADS)}{projection}.")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                             f"({self.num_attention_heads}).")
        activation(self.hidden_act, "hidden_act")

    def layers(self, params: Params, h: jax.Array, bias: jax.Array | None = None) -> jax.Array:
        return encode(params["layers"], h, self.num_attention_heads, self.layer_norm_eps,
                      activation(self.hidden_act, "hidden_act"), bias)

    def headed(self, params: Params, h: jax.Array, pooled: jax.Array, embeds: str) -> dict[str, jax.Array]:
        if self.task == "projection":
            return {embeds: matmul(pooled, params["projection"].T), "last_hidden_state": h}
        return {"last_hidden_state": h, "pooler_output": pooled}


class _Image(_Tower):
    """What both image towers share: square images of ``image_size``, in patches of ``patch_size``."""

    def check(self) -> None:
        super().check()
        if self.image_size < self.patch_size:
            raise ValueError(f"image_size {self.image_size} is smaller than patch_size {self.patch_size}.")

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    def inputs(self) -> dict[str, list]:
        return {"pixel_values": ["batch", self.num_channels, self.image_size, self.image_size]}

    def input_dtypes(self) -> dict[str, str]:
        return {"pixel_values": "float32"}


class _Joint:
    """What ``CLIPModel`` and ``SiglipModel`` share: their towers, made of the ``text_*`` and ``vision_*`` settings
    (``TOWERS``), and the cosine similarity of every image to every text."""

    TOWERS: ClassVar[tuple[type, type]]

    def check_towers(self) -> None:
        if self.head not in ("auto", "none"):
            raise ValueError(f"head={self.head!r} is not a head of {type(self).__name__}; one of auto, none. The towers "
                             f"alone: model={self.TOWERS[0].name} or model={self.TOWERS[1].name}.")
        for side in ("text", "vision"):
            try:
                getattr(self, side)
            except ValueError as e:
                raise ValueError(f"{side}_*: {e}") from None

    @property
    def task(self) -> str:
        return "none"

    def tower(self, side: str, **given: Any) -> Any:
        """The text or image tower (``side``) of the settings named ``{side}_{its setting}``, and ``given``."""
        cls = self.TOWERS[side == "vision"]
        own = {f.name: getattr(self, f"{side}_{f.name}") for f in dataclasses.fields(cls) if hasattr(self, f"{side}_{f.name}")}
        return cls(**own, **given)

    @staticmethod
    def similarity(text: jax.Array, image: jax.Array, scale: jax.Array, bias: jax.Array | None = None
                   ) -> dict[str, jax.Array]:
        """The embeddings normalized, and their cosine similarity times ``exp(scale)`` (plus ``bias``) per text and
        image: ``logits_per_image [images, texts]``, as both models return them."""
        text = text / jnp.linalg.norm(text, axis=-1, keepdims=True)
        image = image / jnp.linalg.norm(image, axis=-1, keepdims=True)
        per_text = matmul(text, image.T) * jnp.exp(scale)
        per_text = per_text if bias is None else per_text + bias
        return {"logits_per_image": per_text.T, "logits_per_text": per_text, "text_embeds": text, "image_embeds": image}

    def input_dtypes(self) -> dict[str, str]:
        return {**self.text.input_dtypes(), **self.vision.input_dtypes()}

    def input_values(self) -> dict[str, tuple[int, int]]:
        return self.text.input_values()


@dataclass(frozen=True)
class ClipText(_Tower, TokenInputs):
    vocab_size: int = 49408
    hidden_size: int = 512
    intermediate_size: int = 2048
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    projection_dim: int = 512  # text_embeds' width (head projection)
    eos_token_id: int = 49407  # where each row is pooled (its first); 2: at its largest id, as older configs say
    head: str = "auto"  # none (CLIPTextModel) | projection (CLIPTextModelWithProjection); auto: the checkpoint's

    name: ClassVar[str] = "clip_text"
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": {"mask_input": "attention_mask"}}

    def __post_init__(self) -> None:
        self.check()

    def init(self, key: jax.Array) -> Params:
        d = self.hidden_size
        k_tok, k_pos, k_proj, *k_layers = jax.random.split(key, 3 + self.num_hidden_layers)
        params = {"embeddings": {"token": normal_init(k_tok, (self.vocab_size, d)),
                                 "position": normal_init(k_pos, (self.max_position_embeddings, d))},
                  "layers": init_layers(k_layers, d, self.intermediate_size), "final_ln": _ln(d)}
        if self.task == "projection":
            params["projection"] = normal_init(k_proj, (self.projection_dim, d))
        return params

    def tower(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(last_hidden_state, pooler_output)``."""
        emb = params["embeddings"]
        s = input_ids.shape[1]
        h = embed(emb["token"], input_ids) + positions(emb["position"], s)
        causal = jnp.arange(s)[None, :] <= jnp.arange(s)[:, None]
        keep = causal[None] & (attention_mask != 0)[:, None, :]
        h = layer_norm(params["final_ln"], self.layers(params, h, mask_bias(keep, h.dtype)[:, None]),
                       self.layer_norm_eps)
        at = jnp.argmax(input_ids if self.eos_token_id == LEGACY_EOS else input_ids == self.eos_token_id, axis=1)
        return h, jnp.take_along_axis(h, at[:, None, None], axis=1)[:, 0]

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array) -> dict[str, jax.Array]:
        return self.headed(params, *self.tower(params, input_ids, attention_mask), "text_embeds")

    def input_holds(self) -> dict[str, int]:
        """Each row's end of text, where it is pooled by id (not by the largest id, the legacy rule)."""
        return {} if self.eos_token_id == LEGACY_EOS else {"input_ids": self.eos_token_id}

    def max_positions(self) -> int:
        """The longest text the position table holds: a build's ``seq`` beyond it is refused."""
        return self.max_position_embeddings


@dataclass(frozen=True)
class ClipVision(_Image):
    image_size: int = 224
    patch_size: int = 32
    num_channels: int = 3
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    projection_dim: int = 512  # image_embeds' width (head projection)
    head: str = "auto"  # none (CLIPVisionModel) | projection (CLIPVisionModelWithProjection); auto: the checkpoint's

    name: ClassVar[str] = "clip_vision"
    padding: ClassVar[dict[str, Any]] = {"batch": "rows"}

    def __post_init__(self) -> None:
        self.check()

    def init(self, key: jax.Array) -> Params:
        d, p = self.hidden_size, self.patch_size
        k_cls, k_patch, k_pos, k_proj, *k_layers = jax.random.split(key, 4 + self.num_hidden_layers)
        params = {"embeddings": {"cls": normal_init(k_cls, (d,)),
                                 "patch": normal_init(k_patch, (d, self.num_channels, p, p)),
                                 "position": normal_init(k_pos, (1 + self.grid ** 2, d))},
                  "pre_ln": _ln(d), "layers": init_layers(k_layers, d, self.intermediate_size), "post_ln": _ln(d)}
        if self.task == "projection":
            params["projection"] = normal_init(k_proj, (self.projection_dim, d))
        return params

    def tower(self, params: Params, pixel_values: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(last_hidden_state, pooler_output)``."""
        emb = params["embeddings"]
        cls = jnp.broadcast_to(emb["cls"], (pixel_values.shape[0], 1, self.hidden_size))
        h = jnp.concatenate([cls, patches(pixel_values, emb["patch"])], axis=1) + emb["position"]
        h = layer_norm(params["pre_ln"], h, self.layer_norm_eps)
        h = self.layers(params, h)
        return h, layer_norm(params["post_ln"], h[:, 0], self.layer_norm_eps)

    def apply(self, params: Params, pixel_values: jax.Array) -> dict[str, jax.Array]:
        return self.headed(params, *self.tower(params, pixel_values), "image_embeds")


@dataclass(frozen=True)
class Clip(_Joint):
    """``CLIPModel``: the two towers (their settings ``text_*`` and ``vision_*``, as config.json's ``text_config`` and
    ``vision_config`` hold them) and the similarity of every image to every text."""

    text_vocab_size: int = 49408
    text_hidden_size: int = 512
    text_intermediate_size: int = 2048
    text_num_hidden_layers: int = 12
    text_num_attention_heads: int = 8
    text_max_position_embeddings: int = 77
    text_hidden_act: str = "quick_gelu"
    text_layer_norm_eps: float = 1e-5
    text_eos_token_id: int = 49407
    vision_image_size: int = 224
    vision_patch_size: int = 32
    vision_num_channels: int = 3
    vision_hidden_size: int = 768
    vision_intermediate_size: int = 3072
    vision_num_hidden_layers: int = 12
    vision_num_attention_heads: int = 12
    vision_hidden_act: str = "quick_gelu"
    vision_layer_norm_eps: float = 1e-5
    projection_dim: int = 512  # both embeddings' width
    logit_scale_init_value: float = 2.6592  # log of the similarity's scale, where no checkpoint gives logit_scale
    head: str = "auto"  # none (CLIPModel); auto: the checkpoint's

    name: ClassVar[str] = "clip"
    TOWERS: ClassVar[tuple[type, type]] = (ClipText, ClipVision)
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "texts": "rows", "seq": {"mask_input": "attention_mask"}}

    def __post_init__(self) -> None:
        self.check_towers()

    @property
    def text(self) -> ClipText:
        return self.tower("text", projection_dim=self.projection_dim)

    @property
    def vision(self) -> ClipVision:
        return self.tower("vision", projection_dim=self.projection_dim)

    def init(self, key: jax.Array) -> Params:
        k_text, k_vision, k_tp, k_vp = jax.random.split(key, 4)
        text, vision = self.text, self.vision
        return {"text": text.init(k_text), "vision": vision.init(k_vision),
                "text_projection": normal_init(k_tp, (self.projection_dim, text.hidden_size)),
                "visual_projection": normal_init(k_vp, (self.projection_dim, vision.hidden_size)),
                "logit_scale": jnp.asarray(self.logit_scale_init_value, jnp.float32)}

    def apply(self, params: Params, input_ids: jax.Array, attention_mask: jax.Array,
              pixel_values: jax.Array) -> dict[str, jax.Array]:
        _, text = self.text.tower(params["text"], input_ids, attention_mask)
        _, image = self.vision.tower(params["vision"], pixel_values)
        return self.similarity(matmul(text, params["text_projection"].T), matmul(image, params["visual_projection"].T),
                               params["logit_scale"])

    def inputs(self) -> dict[str, list]:
        return {"input_ids": ["texts", "seq"], "attention_mask": ["texts", "seq"], **self.vision.inputs()}

    def input_defaults(self) -> dict[str, int]:
        return self.text.input_defaults()

    def input_holds(self) -> dict[str, int]:
        return self.text.input_holds()

    def max_positions(self) -> int:
        return self.text_max_position_embeddings

    def output_scores(self) -> dict[str, str]:
        """Each image's similarities to the texts scored together (a softmax over the texts), as CLIP was trained."""
        return {"logits_per_image": "softmax"}
