"""The model zoo: small plain-JAX models with hyperparameters as dataclass fields.

Every model class has:

- ``name``: its registry key (a class attribute);
- ``init(key) -> params``: a nested dict (lists allowed) of float32 arrays;
- ``apply(params, *inputs, lengths=None) -> array``: pure; inputs positional, in ``inputs()`` order;
  ``lengths`` (only for models that mask) maps a dim name to its true size as an int32 scalar;
- ``inputs() -> {input name: shape}``: each dim an int (fixed width) or a dim name string
  (``"batch"``, ``"seq"``, ``"height"``, ``"width"``); the same name means the same size;
- ``input_dtypes() -> {input name: dtype name}``;
- optionally ``input_values() -> {input name: (lo, hi)}``: the values an integer input may hold (token ids
  in ``[0, vocab)``), checked on every call;
- optionally ``input_defaults() -> {input name: value}``: what fills an input a call leaves out (Hugging Face's
  ``token_type_ids`` zeros, ``attention_mask`` ones);
- optionally ``input_holds() -> {input name: value}``: a value every row of the input must hold (BART's classifier
  reads each row at its end-of-sequence id), checked on every call;
- ``padding``: ``{dim name: "rows" | "mask" | {"mask_input": INPUT}}``, which dims may be padded up to
  a shape bucket (``rows``: independent slices; ``mask``: ``apply`` masks beyond ``lengths[dim]``;
  ``mask_input``: ``apply`` ignores positions where that input is 0). The build proves each
  declaration on the compiled executables.

``MODELS`` maps registry names to classes. ``input_infos(model, dims)`` turns ``inputs()`` into
``tripy_build.InputInfo`` objects given ``{dim name: (min, opt, max)}``.

Importing this package loads only the model modules (no tracing, no compiling, no parameters).
"""

from __future__ import annotations

from typing import Any, Mapping

from .bart import Bart, Marian
from .bert import Albert, Bert, Camembert, DistilBert, Electra, Roberta, XLMRoberta
from .clip import Clip, ClipText, ClipVision
from .convnet import ConvNet
from .deberta import Deberta, DebertaV2
from .geglu import GEGLU
from .gpt2 import GPT2
from .llama import Gemma, Gemma2, Gemma3, Granite, Llama, Mistral, Olmo2, Olmo3, Phi3, Qwen2, Qwen3, SmolLM3
from .mlp import MLP
from .modernbert import ModernBert
from .moe import GptOss, GraniteMoe, Mixtral, Olmoe, Qwen2Moe, Qwen3Moe
from .mpnet import MPNet
from .resnet import ResNet
from .siglip import Siglip, SiglipText, SiglipVision
from .t5 import MT5Encoder, T5Encoder, UMT5Encoder
from .transformer import TransformerBlock
from .vit import ViT
from .whisper import Whisper

MODELS: dict[str, type] = {
    "geglu": GEGLU,
    "mlp": MLP,
    "transformer": TransformerBlock,
    "convnet": ConvNet,
    "bert": Bert,
    "roberta": Roberta,
    "xlm-roberta": XLMRoberta,
    "camembert": Camembert,
    "distilbert": DistilBert,
    "electra": Electra,
    "albert": Albert,
    "mpnet": MPNet,
    "deberta": Deberta,
    "deberta-v2": DebertaV2,
    "modernbert": ModernBert,
    "bart": Bart,
    "marian": Marian,
    "gpt2": GPT2,
    "llama": Llama,
    "qwen2": Qwen2,
    "qwen3": Qwen3,
    "gemma": Gemma,
    "gemma2": Gemma2,
    "gemma3": Gemma3,
    "phi3": Phi3,
    "mistral": Mistral,
    "granite": Granite,
    "smollm3": SmolLM3,
    "olmo2": Olmo2,
    "olmo3": Olmo3,
    "qwen3_moe": Qwen3Moe,
    "qwen2_moe": Qwen2Moe,
    "mixtral": Mixtral,
    "granite_moe": GraniteMoe,
    "olmoe": Olmoe,
    "gpt_oss": GptOss,
    "vit": ViT,
    "resnet50": ResNet,
    "clip": Clip,
    "clip_text": ClipText,
    "clip_vision": ClipVision,
    "siglip": Siglip,
    "siglip_text": SiglipText,
    "siglip_vision": SiglipVision,
    "t5": T5Encoder,
    "mt5": MT5Encoder,
    "umt5": UMT5Encoder,
    "whisper": Whisper,
}


def input_infos(model: Any, dims: Mapping[str, Any]) -> dict[str, Any]:
    """``{input name: InputInfo}`` for ``model``; every named dim becomes one shared ``NamedDimension``.

    ``dims`` maps each dim name the model uses to ``(min, opt, max)`` or to a ``NamedDimension``.
    """
    from ..core.spec import InputInfo, NamedDimension

    named: dict[str, NamedDimension] = {}
    for name, value in dims.items():
        named[name] = value if isinstance(value, NamedDimension) else NamedDimension(name, *value)
    shapes, dtypes = model.inputs(), model.input_dtypes()
    values = model.input_values() if hasattr(model, "input_values") else {}
    fills = model.input_defaults() if hasattr(model, "input_defaults") else {}
    holds = model.input_holds() if hasattr(model, "input_holds") else {}
    missing = sorted({d for shape in shapes.values() for d in shape if isinstance(d, str)} - set(named))
    if missing:
        raise ValueError(
            f"{type(model).__name__} needs a (min, opt, max) range for dim(s) {', '.join(map(repr, missing))}."
        )
    return {
        inp: InputInfo([named[d] if isinstance(d, str) else d for d in shape], dtypes[inp], values.get(inp),
                       fills.get(inp), holds.get(inp))
        for inp, shape in shapes.items()
    }


__all__ = ["MODELS", "GEGLU", "MLP", "TransformerBlock", "ConvNet", "Bert", "Roberta", "XLMRoberta", "Camembert",
           "DistilBert", "Electra", "Albert", "Bart", "Marian",
           "MPNet", "Deberta", "DebertaV2", "ModernBert", "GPT2", "Llama", "Qwen2", "Qwen3", "Mistral", "Granite", "SmolLM3",
           "Gemma", "Gemma2", "Gemma3", "Phi3", "Olmo2", "Olmo3", "Qwen3Moe", "Qwen2Moe", "Mixtral", "GraniteMoe", "GptOss",
           "Olmoe", "ViT", "ResNet", "Clip", "ClipText", "ClipVision", "Siglip", "SiglipText",
           "SiglipVision", "T5Encoder", "MT5Encoder", "UMT5Encoder", "Whisper",
           "input_infos"]
