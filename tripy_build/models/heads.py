"""Task heads on an encoder's hidden states, as Hugging Face's ``*For*`` models apply them (BERT, RoBERTa,
XLM-RoBERTa, CamemBERT, DistilBERT, ELECTRA, ALBERT, MPNet, DeBERTa, ModernBERT), with its output names; what every model
with heads shares (``Headed``), a decoder's heads beside its LM head (``DecoderHeaded``: GPT-2's and the Llama family's), and the
sentence embedding of the states (``sentence_embedding``).

A head is named as the class-name suffix says (``HEADS``): ``none`` (``BertModel``: ``last_hidden_state`` and,
where the family has one, ``pooler_output``), ``sequence_classification`` (``logits [batch, num_labels]``, from
the first token), ``token_classification`` (``logits [batch, seq, num_labels]``), ``question_answering``
(``start_logits``, ``end_logits [batch, seq]``) and ``masked_lm`` (``logits [batch, seq, vocab_size]``: a dense
layer, the activation, a LayerNorm, then the word embeddings transposed, tied as Hugging Face ties them, and a
bias). The families differ only in how a sequence classifier reads the first token (``STYLES``): BERT through
its pooler (``tanh(dense(h[:, 0]))``), RoBERTa and MPNet through a dense layer and tanh of its own, DistilBERT
through a dense layer and ReLU, DeBERTa-v2 through a dense layer and the model's ``pooler_hidden_act`` (its
``ContextPooler``); and in which of them keep the pooler at all. ModernBERT (``transform``) reads every head's input
through the masked-LM head's transform (its ``ModernBertPredictionHead``: dense, ``classifier_activation``, LayerNorm),
its sequence classifier's input the model's pooling of the states (``classifier_pooling``: the first token's, or
the mean over the real ones), its question-answering Linear named ``classifier``. ELECTRA's sequence classifier reads
the first token through a dense layer and GELU (``dense_gelu``), its masked LM transforms with GELU whatever the
model's activation.

Params of a head: ``{"dense": Linear, "ln": LayerNorm, "bias": [vocab]}`` as the head needs, and ``"out"``: the
Linear that gives the logits (for ``masked_lm`` the word embeddings play it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from ._layers import Params, activation, layer_norm, linear, matmul, normal_init

HEADS = ("none", "sequence_classification", "token_classification", "question_answering", "masked_lm")
DECODER_HEADS = ("causal_lm", "none", "sequence_classification", "token_classification", "question_answering")
DECODER_POOLINGS = ("none", "last", "mean")
IMAGE_HEADS = ("none", "image_classification")
CLASSIFIERS = ("sequence_classification", "token_classification", "image_classification")
SCORED = ("sequence_classification", "image_classification")  # one row's classes, scored as problem_type says
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")  # config.json's
SUFFIXES = {"Model": "none", "ForSequenceClassification": "sequence_classification",
            "ForTokenClassification": "token_classification", "ForQuestionAnswering": "question_answering",
            "ForMaskedLM": "masked_lm"}


@dataclass(frozen=True)
class Style:
    """How a family builds its heads."""

    classifier: str  # how a sequence classifier reads the first token: pooler | dense_tanh | dense_relu | dense_gelu
    #                  | dense_act | transform (every head through dense, activation, LayerNorm: ModernBERT's)
    pooler: bool  # whether the bare model (head none) has a pooler
    mlm_act: str | None = None  # the masked-LM head's activation where it is not the model's own


STYLES = {"bert": Style("pooler", True), "roberta": Style("dense_tanh", True, "gelu"),
          "distilbert": Style("dense_relu", False), "mpnet": Style("dense_tanh", True, "gelu"),
          "deberta": Style("dense_act", False), "deberta-v2": Style("dense_act", False), "modernbert": Style("transform", False),
          "electra": Style("dense_gelu", False, "gelu")}


class Headed:
    """What a zoo model with heads shares (its dataclass has ``head``, ``num_labels``, ``labels`` and ``problem_type``
    fields, and ``HEADS``): the head it applies (``task``), its class names (``output_labels``), how its classes are
    scored (``output_scores``), their checks."""

    HEADS: tuple[str, ...] = HEADS

    def check_head(self) -> None:
        if self.head != "auto" and self.head not in self.HEADS:
            raise ValueError(f"head={self.head!r} is not a head of {type(self).__name__}; one of auto, "
                             f"{', '.join(self.HEADS)}.")
        object.__setattr__(self, "labels", tuple(str(x) for x in self.labels))
        if self.task not in CLASSIFIERS and (self.num_labels != 2 or self.labels):
            raise ValueError(f"num_labels={self.num_labels} and labels={list(self.labels)} size and name a classifier's "
                             f"classes, and head={self.task} has none: set them with a classifier head, or leave them "
                             "out.")
        if self.labels and len(self.labels) != self.num_labels:
            raise ValueError(f"labels names {len(self.labels)} classes, num_labels={self.num_labels}: give one name "
                             "per class, or no labels.")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type={self.problem_type!r} is not one of {', '.join(PROBLEM_TYPES)} (or null: "
                             "by num_labels).")
        if self.problem_type is not None and self.task not in SCORED:
            raise ValueError(f"problem_type={self.problem_type} says how a classifier's logits are scored, and "
                             f"head={self.task} has none: set it with head=sequence_classification, or leave it out.")

    @property
    def task(self) -> str:
        """The head this model applies: ``head``, with ``auto`` (no checkpoint to say) as ``none``."""
        return "none" if self.head == "auto" else self.head

    def check_pooling(self, poolings: tuple[str, ...]) -> None:
        """``pooling`` one of ``poolings``, only on the bare model (a head replaces the states it pools), and
        ``normalize`` only with a pooling; ``ValueError`` naming the setting."""
        if self.pooling not in poolings:
            raise ValueError(f"pooling={self.pooling!r} is not a pooling of {type(self).__name__}; one of "
                             f"{', '.join(poolings)}.")
        if self.pooling != "none" and self.task != "none":
            raise ValueError(f"pooling={self.pooling} makes a sentence embedding of the model's states, and head="
                             f"{self.task} replaces them with its own outputs: pool with head=none.")
        if self.normalize and self.pooling == "none":
            raise ValueError("normalize=true scales the sentence embedding, which pooling=none does not make: set "
                             f"pooling={poolings[1]}.")

    def output_labels(self) -> dict[str, list[str]]:
        """A classifier's class names per output (id2label): what ``inspect``, the manifest and the server show."""
        if self.task not in CLASSIFIERS:
            return {}
        return {"logits": list(self.labels or (f"LABEL_{i}" for i in range(self.num_labels)))}

    def output_scores(self) -> dict[str, str]:
        """How a classifier's ``logits`` become its classes' scores, by transformers' text- and image-classification
        pipelines' rule: ``none`` for a regression, ``sigmoid`` for a multi-label classifier or a single class (a
        cross-encoder's relevance), else ``softmax``; {} for the other heads."""
        if self.task not in SCORED:
            return {}
        if self.problem_type == "regression":
            return {"logits": "none"}
        multi = self.problem_type == "multi_label_classification" or self.num_labels == 1
        return {"logits": "sigmoid" if multi else "softmax"}


class DecoderHeaded(Headed):
    """A decoder's heads (GPT-2's, the Llama family's: ``DECODER_HEADS``, Hugging Face's class-name suffixes): its
    dataclass has ``head``, ``num_labels``, ``labels``, ``pad_token_id``, ``pooling`` and ``normalize`` fields.
    ``causal_lm`` (the default without a checkpoint to say) is the family's own LM head; the others read the final
    norm's states (``head_outputs``)."""

    HEADS = DECODER_HEADS

    @property
    def task(self) -> str:
        """The head this model applies: ``head``, with ``auto`` (no checkpoint to say) as ``causal_lm``."""
        return "causal_lm" if self.head == "auto" else self.head

    def check_heads(self) -> None:
        """The head and pooling checked; ``pad_token_id``, which only the sequence classifier reads, dropped under
        the others (config.json holds it whatever the head), so that no build records a setting that changed
        nothing."""
        self.check_head()
        self.check_pooling(DECODER_POOLINGS)
        if self.task != "sequence_classification":
            object.__setattr__(self, "pad_token_id", None)

    def score_init(self, key: jax.Array, d: int, token_bias: bool = True) -> Params | None:
        """The Linear ``score`` of a head other than the LM head (Hugging Face's ``score``, ``classifier`` or
        ``qa_outputs``), None for the others: ``[num_labels, d]``, with a bias for the token classifier where
        ``token_bias`` (the sequence classifier has none); the question-answering head's ``[2, d]`` (start, end)
        with a bias."""
        if self.task not in ("sequence_classification", "token_classification", "question_answering"):
            return None
        qa = self.task == "question_answering"
        out = 2 if qa else self.num_labels
        bias = qa or (self.task == "token_classification" and token_bias)
        return {"weight": normal_init(key, (out, d)), **({"bias": jnp.zeros((out,), jnp.float32)} if bias else {})}

    def head_outputs(self, score: Params | None, h: jax.Array, input_ids: jax.Array,
                     attention_mask: jax.Array) -> dict[str, jax.Array]:
        """A head other than the LM head on the final norm's states ``h: [b, s, d]``: ``none``
        ``{"last_hidden_state"}`` (with ``pooling``, ``sentence_embedding`` too), ``sequence_classification``
        ``{"logits": [b, num_labels]}``, the ``score`` Linear of each row's last real token (the last whose mask is 1
        and, with a ``pad_token_id``, whose id is not it: Hugging Face's rule, left or right padding alike),
        ``token_classification`` ``{"logits": [b, s, num_labels]}`` and ``question_answering`` (``*ForQuestionAnswering``:
        an answer span's ``{"start_logits", "end_logits": [b, s]}``, the ``score`` Linear's two outputs)."""
        if self.task == "none":
            pooled = ({"sentence_embedding": sentence_embedding(h, attention_mask, self.pooling, self.normalize)}
                      if self.pooling != "none" else {})
            return {"last_hidden_state": h, **pooled}
        if self.task == "sequence_classification":
            keep = attention_mask != 0
            if self.pad_token_id is not None:
                keep = keep & (input_ids != self.pad_token_id)
            h = jnp.take_along_axis(h, last_real(keep)[:, None, None], axis=1)[:, 0]
        logits = matmul(h, score["weight"].T) + (score["bias"] if "bias" in score else 0.0)
        if self.task == "question_answering":
            return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}
        return {"logits": logits}


def has_pooler(head: str, style: Style) -> bool:
    """Whether the encoder keeps its pooler under ``head``: Hugging Face's heads other than BERT's sequence
    classifier build the model with ``add_pooling_layer=False``, and so save no pooler."""
    return (head == "none" and style.pooler) or (head == "sequence_classification" and style.classifier == "pooler")


def outputs(head: str, style: Style) -> tuple[str, ...]:
    if head == "none":
        return ("last_hidden_state", "pooler_output") if style.pooler else ("last_hidden_state",)
    return ("start_logits", "end_logits") if head == "question_answering" else ("logits",)


def init(key: jax.Array, head: str, style: Style, d: int, num_labels: int, vocab: int,
         linear_init: Any, ln_init: Any, embedding_size: int | None = None) -> Params:
    """A head's params (none for ``none``); ``linear_init(key, din, dout)`` and ``ln_init(d)``: the family's. The
    masked-LM head transforms to ``embedding_size`` (the word embeddings' width; ``d`` by default)."""
    k_dense, k_out = jax.random.split(key)
    if head == "none":
        return {}
    if head == "masked_lm":
        e = embedding_size or d
        return {"dense": linear_init(k_dense, d, e), "ln": ln_init(e), "bias": jnp.zeros((vocab,), jnp.float32)}
    out = {"out": linear_init(k_out, d, 2 if head == "question_answering" else num_labels)}
    if style.classifier == "transform":
        out.update(dense=linear_init(k_dense, d, d), ln=ln_init(d))
    elif head == "sequence_classification" and style.classifier != "pooler":
        out["dense"] = linear_init(k_dense, d, d)
    return out


def apply(params: Params, head: str, style: Style, h: jax.Array, pooled: jax.Array | None, word: jax.Array,
          act: str, eps: float, pooler_act: str = "tanh") -> dict[str, jax.Array]:
    """The head's outputs from hidden states ``h: [b, s, d]`` (``pooled``: the pooler's output, where the
    encoder kept it, or the ``transform`` style's pooling of the states; ``word``: the word embeddings, which the
    masked-LM head's decoder is tied to; ``pooler_act``: the ``dense_act`` classifier's activation, and the
    ``transform``'s). A masked-LM ``bias`` left out of ``params`` adds none (ModernBERT's ``decoder_bias: false``)."""
    if head == "none":
        return {"last_hidden_state": h, **({"pooler_output": pooled} if pooled is not None else {})}
    if style.classifier == "transform":
        x = pooled if head == "sequence_classification" else h
        t = layer_norm(params["ln"], activation(pooler_act, "classifier_activation")(linear(params["dense"], x)), eps)
        if head == "masked_lm":
            logits = matmul(t, word.T)
            return {"logits": logits + params["bias"] if "bias" in params else logits}
        out = linear(params["out"], t)
        return {"start_logits": out[..., 0], "end_logits": out[..., 1]} if head == "question_answering" else \
            {"logits": out}
    if head == "sequence_classification":
        if style.classifier == "pooler":
            first = pooled
        else:
            squash = {"dense_tanh": jnp.tanh, "dense_relu": jax.nn.relu, "dense_gelu": activation("gelu", "")
                      }.get(style.classifier) or activation(pooler_act, "pooler_hidden_act")
            first = squash(linear(params["dense"], h[:, 0]))
        return {"logits": linear(params["out"], first)}
    if head == "token_classification":
        return {"logits": linear(params["out"], h)}
    if head == "question_answering":
        both = linear(params["out"], h)
        return {"start_logits": both[..., 0], "end_logits": both[..., 1]}
    t = activation(style.mlm_act or act, "hidden_act")(linear(params["dense"], h))
    t = layer_norm(params["ln"], t, eps)
    return {"logits": matmul(t, word.T) + params["bias"]}


def last_real(keep: jax.Array) -> jax.Array:
    """``[batch]``: each row's last position where ``keep: [batch, seq]`` holds (0 where none does), as Hugging
    Face's decoders find the token a sequence classifier reads and sentence-transformers' last-token pooling does:
    left or right padding alike."""
    return jnp.argmax(jnp.arange(keep.shape[1]) * keep.astype(jnp.int32), axis=-1)


def sentence_embedding(h: jax.Array, attention_mask: jax.Array, pooling: str, normalize: bool) -> jax.Array:
    """``[batch, d]``: the mean of the states at the real tokens (``attention_mask`` 1: padding never counts), the
    first token's (``cls``), or the last real token's (``last``: a decoder's, whose last token has seen the whole
    text); scaled to unit length with ``normalize`` (sentence-transformers' ``Pooling`` and ``Normalize``, for the
    embedding models built on these models)."""
    if pooling == "cls":
        emb = h[:, 0]
    elif pooling == "last":
        emb = jnp.take_along_axis(h, last_real(attention_mask != 0)[:, None, None], axis=1)[:, 0]
    else:
        keep = (attention_mask != 0).astype(h.dtype)[..., None]
        emb = jnp.sum(h * keep, axis=1) / jnp.maximum(jnp.sum(keep, axis=1), 1e-9)
    if normalize:
        emb = emb / jnp.maximum(jnp.linalg.norm(emb, axis=-1, keepdims=True), 1e-12)
    return emb
