"""Whisper (Hugging Face ``WhisperForConditionalGeneration``, ``WhisperModel``: openai/whisper-tiny to -large-v3,
distil-whisper and the fine-tunes of their architecture), in plain JAX.

Fields are ``WhisperConfig``'s keys, defaults whisper-tiny's, so a checkpoint's ``config.json`` maps onto the
dataclass by key (``models/hf.py``).

Inputs: ``input_features`` float32 ``[batch, num_mel_bins, 2 * max_source_positions]`` (the log-mel spectrogram of
30 seconds of 16 kHz audio, 3000 frames: ``runtime/audio.py`` makes it as transformers' ``WhisperFeatureExtractor``
does; the encoder takes exactly that many frames, as transformers' refuses any other) and ``decoder_input_ids`` int32
``[batch, seq]``: the text so far, starting with ``<|startoftranscript|>``.

    enc = gelu(conv2(gelu(conv1(input_features))))^T + enc_pos        # conv2 strides 2: 3000 frames -> 1500
    per encoder layer (pre-LN): h = h + SelfAttention(LN(h)); h = h + fc2(act(fc1(LN(h))))
    enc = LN(h)
    dec = embed[ids] * scale + dec_pos[0..s-1]
    per decoder layer: h = h + CausalSelfAttention(LN(h)); h = h + CrossAttention(LN(h), enc); h = h + fc2(act(fc1(LN(h))))
    logits = LN(h) @ embed^T                                         # proj_out, tied to the embeddings

(the attention's key projection has no bias; ``scale``: sqrt(d_model) with ``scale_embedding``, else 1). Outputs:
``conditional_generation`` (the default) ``{"logits": [batch, seq, vocab]}``; ``none`` ``{"last_hidden_state": the
decoder's, "encoder_last_hidden_state"}``. With ``task=generate`` the encoder and one decoder step are two entries
(``models/_seq2seq.py``), and the reply starts with the checkpoint's prompt (the start token, the language, the task,
``<|notimestamps|>``: ``runtime/seq2seq.py``).

Padding at the end of ``seq`` is exact: the decoder is causal. Hence ``padding = {"batch": "rows", "seq": "mask"}``.

Params (Hugging Face's layouts: Linear weights ``[out, in]``, Conv1d weights ``[out, in, 3]``)::

    {"encoder": {"conv1" | "conv2": {"weight", "bias"}, "position": [max_source_positions, d], "ln": LN,
                 "layers": [{"q" | "k" (no bias) | "v" | "out" | "fc1" | "fc2": Linear, "attn_ln" | "final_ln": LN}]},
     "decoder": {"embed": [vocab_size, d], "position": [max_target_positions, d], "ln": LN,
                 "layers": [{... as the encoder's, and "cross_q" | "cross_k" | "cross_v" | "cross_out": Linear,
                             "cross_ln": LN}]}}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ..core.spec import InputInfo
from ._layers import (
    Params, activation, attend, embed, fused_qkv, grouped_attention, head_embed, head_logits, layer_norm, linear,
    mask_bias, matmul, normal_init, positions,
)
from ._seq2seq import DecoderSized, attend_step, layer_of, step_bias, write_step
from .bert import _ln
from .heads import Headed

HEADS = ("conditional_generation", "none")


@dataclass(frozen=True)
class Whisper(Headed, DecoderSized):
    vocab_size: int = 51865
    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    decoder_layers: int = 4
    encoder_attention_heads: int = 6
    decoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_ffn_dim: int = 1536
    activation_function: str = "gelu"
    max_source_positions: int = 1500  # the encoder's positions: the features' frames over conv2's stride (2)
    max_target_positions: int = 448  # the decoder's positions: the prompt and the reply together
    scale_embedding: bool = False
    decoder_start_token_id: int = 50258  # <|startoftranscript|>
    # conditional_generation (the default: task=generate transcribes) | none; auto: the checkpoint's
    head: str = "auto"
    num_labels: int = 2  # Headed's: Whisper's heads have no classes, so setting these is refused (check_head)
    labels: tuple = ()
    problem_type: str | None = None

    name: ClassVar[str] = "whisper"
    HEADS: ClassVar[tuple[str, ...]] = HEADS
    padding: ClassVar[dict[str, Any]] = {"batch": "rows", "seq": "mask"}
    SPEECH: ClassVar[bool] = True  # its replies open with a language and task, its calls take audio (builder/generate.py)

    def __post_init__(self) -> None:
        self.check_sizes()
        activation(self.activation_function, "activation_function")
        self.check_head()

    @property
    def task(self) -> str:
        """The head this model applies: ``head``, with ``auto`` (no checkpoint to say) as ``conditional_generation``."""
        return "conditional_generation" if self.head == "auto" else self.head

    @property
    def frames(self) -> int:
        """The features' frames the encoder takes: 30 seconds at 100 frames a second (3000)."""
        return 2 * self.max_source_positions

    def inputs(self) -> dict[str, list]:
        return {"input_features": ["batch", self.num_mel_bins, self.frames], "decoder_input_ids": ["batch", "seq"]}

    def input_dtypes(self) -> dict[str, str]:
        return {"input_features": "float32", "decoder_input_ids": "int32"}

    def input_values(self) -> dict[str, tuple[int, int]]:
        return {"decoder_input_ids": (0, self.vocab_size)}

    def max_positions(self) -> int:
        """The longest decoder text the position table holds: a build's ``seq`` beyond it is refused."""
        return self.max_target_positions

    def positions_limit(self) -> str:
        return f"Whisper's decoder position table holds {self.max_target_positions} positions (max_target_positions)"

    def init(self, key: jax.Array) -> Params:
        d = self.d_model
        k_c1, k_c2, k_enc, k_dec, k_embed, k_pos = jax.random.split(key, 6)
        conv = lambda k, c_in: {"weight": normal_init(k, (d, c_in, 3)), "bias": jnp.zeros((d,), jnp.float32)}  # noqa: E731
        return {"encoder": {"conv1": conv(k_c1, self.num_mel_bins), "conv2": conv(k_c2, d),
                            "position": jnp.asarray(sinusoids(self.max_source_positions, d)), "ln": _ln(d),
                            "layers": self.layer_stack(k_enc, self.encoder_layers, self.encoder_ffn_dim, False, key_bias=False)},
                "decoder": {"embed": normal_init(k_embed, (self.vocab_size, d)),
                            "position": normal_init(k_pos, (self.max_target_positions, d)), "ln": _ln(d),
                            "layers": self.layer_stack(k_dec, self.decoder_layers, self.decoder_ffn_dim, True, key_bias=False)}}

    def _ffn(self, p: Params, h: jax.Array) -> jax.Array:
        act = activation(self.activation_function, "activation_function")
        return h + linear(p["fc2"], act(linear(p["fc1"], layer_norm(p["final_ln"], h))))

    def _encoded(self, params: Params, input_features: jax.Array) -> jax.Array:
        """The encoder's last hidden state ``[batch, max_source_positions, d]``."""
        enc = params["encoder"]
        x = input_features.astype(enc["conv1"]["weight"].dtype)
        for name, stride in (("conv1", 1), ("conv2", 2)):
            x = jax.lax.conv_general_dilated(x, enc[name]["weight"], (stride,), [(1, 1)],
                                             dimension_numbers=("NCH", "OIH", "NCH"))
            x = jax.nn.gelu(x + enc[name]["bias"][None, :, None], approximate=False)
        h = x.swapaxes(1, 2) + enc["position"]
        heads = self.encoder_attention_heads
        scale = 1.0 / math.sqrt(self.d_model // heads)
        for p in enc["layers"]:
            w_qkv, b_qkv = fused_qkv(p["q"], p["k"], p["v"], scale)
            qkv = matmul(layer_norm(p["attn_ln"], h), w_qkv) + b_qkv
            h = self._ffn(p, h + linear(p["out"], attend(qkv, heads)))
        return layer_norm(enc["ln"], h)

    def _cross(self, p: Params, encoded: jax.Array) -> tuple[jax.Array, jax.Array]:
        """A decoder layer's cross-attention keys and values of the encoder's output, ``[b, heads, frames, hd]``."""
        heads = self.decoder_attention_heads
        b, s, _ = encoded.shape
        return tuple(linear(p[f"cross_{n}"], encoded).reshape(b, s, heads, -1).swapaxes(1, 2) for n in "kv")

    def apply(self, params: Params, input_features: jax.Array, decoder_input_ids: jax.Array,
              lengths: dict[str, jax.Array] | None = None) -> dict[str, jax.Array]:
        """The decoder over ``decoder_input_ids``; ``lengths`` unread: the decoder is causal, so the padding after a
        row's text changes none of its positions."""
        encoded = self._encoded(params, input_features)
        dec = params["decoder"]
        s = decoder_input_ids.shape[1]
        heads = self.decoder_attention_heads
        scale = 1.0 / math.sqrt(self.d_model // heads)
        causal = mask_bias(jnp.arange(s)[None, :] <= jnp.arange(s)[:, None], jnp.float32)[None, None]
        grow = math.sqrt(self.d_model) if self.scale_embedding else 1.0
        h = embed(dec["embed"], decoder_input_ids) * grow + positions(dec["position"], s)
        for p in dec["layers"]:
            w_qkv, b_qkv = fused_qkv(p["q"], p["k"], p["v"], scale)
            h = h + linear(p["out"], attend(matmul(layer_norm(p["attn_ln"], h), w_qkv) + b_qkv, heads, causal))
            q = (linear(p["cross_q"], layer_norm(p["cross_ln"], h)) * scale).reshape(*h.shape[:2], heads, -1)
            k, v = self._cross(p, encoded)
            h = h + linear(p["cross_out"], grouped_attention(q, k, v, jnp.zeros((1, 1, 1, 1), jnp.float32)).reshape(h.shape))
            h = self._ffn(p, h)
        h = layer_norm(dec["ln"], h)
        if self.task == "none":
            return {"last_hidden_state": h, "encoder_last_hidden_state": encoded}
        return {"logits": head_logits(h, dec["embed"])}

    # --- generation (head=conditional_generation): models/_seq2seq.py -------------------------------
    def encode_inputs(self, batch: Any, seq: Any) -> dict[str, InputInfo]:
        """``encode``'s input: the features of 30 seconds of audio (``seq`` unread: the encoder's length is fixed)."""
        return {"input_features": InputInfo((batch, self.num_mel_bins, self.frames), "float32")}

    def step_inputs(self, batch: Any, seq: Any, max_length: int, cache_dtype: str = "float32") -> dict[str, InputInfo]:
        """As an encoder-decoder's, over the encoder's fixed ``max_source_positions`` (``seq`` unread)."""
        return super().step_inputs(batch, self.max_source_positions, max_length, cache_dtype)

    def cross_inputs(self, batch: Any, seq: Any, dtype: str) -> list[InputInfo]:
        """As an encoder-decoder's, over the encoder's fixed ``max_source_positions`` (``seq`` unread)."""
        return super().cross_inputs(batch, self.max_source_positions, dtype)

    def encode(self, params: Params, input_features: jax.Array) -> dict[str, jax.Array]:
        """The encoder over the features, and each decoder layer's cross-attention keys and values of its output."""
        encoded = self._encoded(params, input_features)
        return {"cross": [a for p in params["decoder"]["layers"] for a in self._cross(p, encoded)]}

    def step(self, params: Params, input_ids: jax.Array, cache_index: jax.Array, encoder_mask: jax.Array,
             cross: list[jax.Array], cache: list[jax.Array]) -> dict[str, Any]:
        """One decoder token per row at its position ``cache_index`` (``models/_seq2seq.py``); ``encoder_mask`` is
        all ones (the encoder's frames are all real: silence is padded as features, not masked)."""
        dec = params["decoder"]
        heads, hd = self._heads()
        b = input_ids.shape[0]
        scale = 1.0 / math.sqrt(hd)
        grow = math.sqrt(self.d_model) if self.scale_embedding else 1.0
        h = head_embed(dec["embed"], input_ids[:, 0]) * grow + embed(dec["position"], cache_index)
        cache = list(cache)
        seen = step_bias(cache_index, cache[0].shape[2])
        source = mask_bias(encoder_mask != 0, jnp.float32)[:, None, None, :]
        for i, p in enumerate(dec["layers"]):
            x = layer_norm(p["attn_ln"], h)
            q, k, v = (linear(p[n], x).reshape(b, heads, hd) for n in "qkv")
            h = h + linear(p["out"], attend_step(q * scale, *write_step(cache, i, k, v, cache_index), seen))
            q = linear(p["cross_q"], layer_norm(p["cross_ln"], h)).reshape(b, heads, hd) * scale
            h = h + linear(p["cross_out"], attend_step(q, *layer_of(cross, i), source))
            h = self._ffn(p, h)
        return {"logits": head_logits(layer_norm(dec["ln"], h), dec["embed"]), "cache": cache}


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> jax.Array:
    """Whisper's encoder position table (the checkpoint holds it; a model built without one starts from it): the
    sines of ``t / max_timescale ** (j / (channels / 2 - 1))`` in the first half, their cosines in the second."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    scaled = jnp.arange(length, dtype=jnp.float32)[:, None] * jnp.exp(-increment * jnp.arange(channels // 2))[None]
    return jnp.concatenate([jnp.sin(scaled), jnp.cos(scaled)], axis=1)
