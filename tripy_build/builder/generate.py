"""task=generate: a model's ``extend`` compiled as two entries, ``prefill`` and ``decode``; or an encoder-decoder's
``encode`` and ``step`` (``models/_seq2seq.py``) as ``encode`` and ``decode``, with ``reorder`` (its cache's rows
gathered on the device: beam search's continuations).

A model that generates has ``extend(params, input_ids, position_ids, attention_mask, cache, cache_index)``
(run new tokens against a key/value cache, write theirs into it, return the last token's logits and the
cache), ``extend_inputs(batch, seq, max_length, one_row, cache_dtype)`` (its ``InputInfo``) and ``cache_shape(batch,
max_length)``. ``prefill`` is ``extend`` over one row's prompt chunks (the ``seq`` dim's buckets) into a
batch's cache, ``decode`` over every row: one token (a step), or a chunk of prompts that start together
(``wide_chunks``); both take the cache donated (decode also pads its batch by rows), and share the
weights and their prep. The artifact records what ``runtime/generate.py`` (an encoder-decoder's:
``runtime/seq2seq.py``) needs to drive them (``metadata["generate"]``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import jax
import jax.numpy as jnp

from ..core.entry import Entry
from ..core.profiles import DEFAULT_BUCKETS, resolve_buckets
from ..core.spec import InputInfo, NamedDimension
from ..errors import CallError, ConfigError
from ..models import _seq2seq
from ..runtime.generate import SEQ2SEQ_LIMITS, Spec

log = logging.getLogger(__name__)

PREFILL, DECODE, ENCODE, REORDER, EXPAND = "prefill", "decode", "encode", "reorder", "expand"
METHODS = ("extend", "extend_inputs", "cache_shape")
# generation_config.json's settings transformers' generate applies and this one does not: said at build where set
UNAPPLIED = {"num_beams": 1, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "min_length": 0,
             "min_new_tokens": None, "bad_words_ids": None, "suppress_tokens": None, "begin_suppress_tokens": None}


def _has(model: Any, methods: tuple[str, ...]) -> bool:
    return all(callable(getattr(model, m, None)) for m in methods)


def seq2seq(model: Any) -> bool:
    """Whether ``model`` is an encoder-decoder that generates (``models/_seq2seq.py``): built with its LM head."""
    return _has(model, _seq2seq.METHODS) and getattr(model, "task", None) == "conditional_generation"


def can_generate(model: Any) -> bool:
    """Whether ``model`` has what generation runs: a decoder's ``extend``, or an encoder-decoder's LM head."""
    return seq2seq(model) or _has(model, METHODS)


def check_model(model: Any, model_name: str) -> None:
    """``model`` generates: it has a decoder's ``extend`` (or an encoder-decoder's ``encode`` and ``step``) and is
    built with its language model head; else a ``ConfigError`` naming what it lacks and what does generate."""
    pair = _has(model, _seq2seq.METHODS)
    missing = [m for m in METHODS if not callable(getattr(model, m, None))]
    if missing and not pair:
        from ..models import MODELS

        able = [n for n, c in MODELS.items() if _has(c, METHODS) or _has(c, _seq2seq.METHODS)]
        raise ConfigError(f"task=generate: model {model_name!r} cannot generate (it has no {missing[0]}() method); "
                          f"models that generate: {', '.join(able)}. Use task=forward for this model.")
    head, checkpoint = ("conditional_generation", "*ForConditionalGeneration") if pair else ("causal_lm", "*ForCausalLM")
    if getattr(model, "task", head) != head:
        raise ConfigError(f"task=generate: model {model_name!r} is built with head={model.task}, which has no language "
                          f"model head to pick tokens from; generate with head={head} (a {checkpoint} checkpoint), "
                          "or use task=forward for this head.")


def check_shapes(model: Any, shapes: dict[str, Any], buckets: dict[str, Any]) -> None:
    """A decoder's prompts run in chunks of the ``seq`` buckets, so 1 must be among them (any length is then a sum
    of them); an encoder-decoder's ``seq`` is its sources' length, any range."""
    seq = shapes.get("seq")
    if seq2seq(model) or not isinstance(seq, NamedDimension):
        return
    if seq.min != 1:
        raise ConfigError(f"shapes.dims.seq: task=generate runs a prompt in chunks of the seq buckets, which must "
                          f"include 1 (any length is then a sum of them); its min is {seq.min}; set it to [1, ..., ...].")
    if 1 not in resolve_buckets(buckets.get("seq", DEFAULT_BUCKETS), seq.bounds, "shapes.buckets.seq"):
        raise ConfigError("shapes.buckets.seq: task=generate needs 1 among the seq buckets (prompts run in chunks of "
                          "them); use pow2, or a list with 1.")


def resolved(generate: dict[str, Any], model: Any, checkpoint: str | None, rows: int | None = None) -> dict[str, Any]:
    """``generate`` with what ``auto`` leaves to the checkpoint (``checkpoint``: a Hugging Face directory; none
    without one) resolved: its ``eos_token_id`` (a list), the ``pad_token_id`` a stopped row is filled with, and
    its ``sampling`` defaults (``runtime/sampling.py``) and ``beams`` (``rows``: the most the batch holds, which a
    source's beams must fit in). Resolved before the build key is made, so a checkpoint
    whose generation config changed is a new build. An id the vocabulary cannot hold could never be generated:
    given, it is refused; from the checkpoint (transformers' tiny configs keep GPT-2's 50256), it is left out, and
    said."""
    from ..models import hf

    if not can_generate(model):
        return generate  # ``entries`` refuses it, naming what it lacks
    eos = generate.get("eos_token_id", "auto")
    found = (hf.generation_defaults(checkpoint) if checkpoint is not None else
             {"eos_token_id": [], "pad_token_id": None, "sampling": {}, "source": None})
    vocab = int(model.vocab_size)
    outside = [t for t in (found["eos_token_id"] if eos == "auto" else eos) if not 0 <= t < vocab]
    if eos != "auto" and outside:
        raise ConfigError(f"generate.eos_token_id: {outside[0]} is outside the vocabulary [0, {vocab}), so no row "
                          f"could stop at it; give ids below {vocab}, or null for none.")
    if eos == "auto":
        if outside:
            log.warning("generate.eos_token_id: the checkpoint's %s %s outside the vocabulary [0, %d) and never "
                        "generated: left out (set generate.eos_token_id to choose)", outside,
                        "is" if len(outside) == 1 else "are", vocab)
        eos = [t for t in found["eos_token_id"] if t not in outside]
    pad = found["pad_token_id"]
    applied = _applied(found, vocab) if seq2seq(model) else {}
    config = found["sampling"]
    given = generate.get("beams", "auto")
    beams, said = _beams(given, config, model, rows)
    unapplied = {k: config[k] for k, neutral in UNAPPLIED.items() if config.get(k) not in (None, neutral)
                 and APPLIED_AS.get(k, k) not in applied and not (k == "num_beams" and said)
                 and not ("suppressed" in applied and k in SUPPRESSING and all(len(w) == 1 for w in _words(config, k)))}
    if unapplied:
        log.warning("%s asks transformers' generate for %s, which tripy_build's does not apply (one sequence per "
                    "prompt, each token picked by generate.sampling): its replies can differ from transformers'",
                    found["source"], ", ".join(f"{k}={v}" for k, v in unapplied.items()))
    speech = _speech(model, checkpoint, found) if seq2seq(model) and getattr(model, "SPEECH", False) else {}
    return {**generate, "eos_token_id": eos, "pad_token_id": pad if pad is not None and 0 <= pad < vocab else None,
            "sampling": _sampling(generate.get("sampling", "auto"), found), "beams": beams, **applied, **speech}


def _speech(model: Any, checkpoint: str | None, found: dict[str, Any]) -> dict[str, Any]:
    """What a speech model's (Whisper's) artifact records for its calls: the opening its replies start with
    (``runtime/transcription.Opening``: the checkpoint's language, task and ``<|notimestamps|>`` settings) and how
    its audio becomes features (``runtime/audio.LogMel``: the checkpoint's ``preprocessor_config.json``, else
    transformers' ``WhisperFeatureExtractor`` defaults at the model's ``num_mel_bins``)."""
    from ..models.hf import CheckpointError, preprocessor_config
    from ..runtime.audio import LogMel
    from ..runtime.transcription import Opening

    try:
        opening = Opening.from_generation_config(found["sampling"], int(model.vocab_size))
    except CallError as e:
        raise CheckpointError(f"{found['source']}: {e} Fix the file.") from None
    config, path = preprocessor_config(checkpoint) if checkpoint is not None else (None, None)
    try:
        audio = LogMel.from_config(config) if config is not None else LogMel(feature_size=int(model.num_mel_bins))
    except CallError as e:
        raise CheckpointError(f"{path}: {e}") from None
    if (audio.feature_size, audio.frames) != (model.num_mel_bins, model.frames):
        raise CheckpointError(f"{path or 'the default features'}: {audio.feature_size} mel bins x {audio.frames} frames, and the "
                              f"model's encoder takes {model.num_mel_bins} x {model.frames} (config.json's num_mel_bins "
                              "and 2 x max_source_positions); the two files are of different models.")
    return {"opening": opening.recorded(), "audio": dataclasses.asdict(audio)}


def _beams(given: Any, config: dict[str, Any], model: Any, rows: int | None) -> tuple[dict[str, Any], bool]:
    """The beam search the artifact records for calls that leave it out (``runtime/beams.Beams``; {}: one beam):
    ``generate.beams`` as given, or for ``auto`` the checkpoint's (``num_beams`` above 1 without ``do_sample`` or
    ``repetition_penalty``: beams that sample or penalize are not built, and said unapplied); and
    whether the checkpoint's ``num_beams`` is accounted for (applied, set aside by the config, or said here)."""
    from ..runtime.beams import Beams

    if given == "auto":
        if config.get("do_sample") or config.get("repetition_penalty") not in (None, 1.0) or \
                not _count(config.get("num_beams")):
            return {}, False
        given = {k: config[k] for k in BEAM_SETTINGS if config.get(k) is not None}
        auto = True
    elif given is None:
        return {}, True
    elif not isinstance(given, dict):
        raise ConfigError(f"generate.beams: {str(given)[:60]!r}: give auto (the checkpoint's), null (one beam) or "
                          "{num_beams: 4, length_penalty: 2.0, early_stopping: true}.")
    else:
        auto = False
    unknown = [k for k in given if k not in BEAM_SETTINGS]
    if unknown:
        raise ConfigError(f"generate.beams: {str(unknown[0])[:40]!r} is not a beam search setting; they are "
                          f"{', '.join(BEAM_SETTINGS)}.")
    try:
        beams = Beams(**given)
    except CallError as e:
        raise ConfigError(f"generate.beams: {e}") from None
    if rows is not None and beams.num_beams > rows:
        fix = (f"a source's beams are rows of one batch, and shapes.dims.batch holds at most {rows}; build with "
               f"shapes.dims.batch up to {beams.num_beams} or more")
        if not auto:
            raise ConfigError(f"generate.beams: num_beams={beams.num_beams}: {fix}, or ask for fewer beams.")
        log.warning("generate.beams: the checkpoint's num_beams=%d is not applied (calls run one beam): %s for its "
                    "search.", beams.num_beams, fix)
        return {}, True
    if auto and beams.num_beams > 1:
        log.info("generate.beams: %s from the checkpoint's generation config, for calls that leave num_beams out "
                 "(generate.beams=null: one beam)", " ".join(f"{k}={v}" for k, v in beams.recorded().items()))
    return beams.recorded(), True


def _applied(found: dict[str, Any], vocab: int) -> dict[str, Any]:
    """What an encoder-decoder's replies take of the checkpoint's generation settings (``runtime/seq2seq.forced``):
    its forced first and last tokens, the tokens it never generates (``suppressed``), ``min_length`` and
    ``no_repeat_ngram_size``; each only where set (and within the vocabulary)."""
    config = found["sampling"]
    out = {k: found[k] for k in ("forced_bos_token_id", "forced_eos_token_id")
           if found.get(k) is not None and 0 <= found[k] < vocab}
    suppressed = _suppressed(config, vocab)
    if suppressed:
        out["suppressed"] = suppressed
    first = sorted({t for w in _words(config, "begin_suppress_tokens") for t in w if 0 <= t < vocab})
    if first:
        out["begin_suppressed"] = first
    return {**out, **{k: config[k] for k in SEQ2SEQ_LIMITS if _count(config.get(k))}}


def _count(value: Any) -> bool:
    """Whether ``value`` is a positive whole number (a setting a generation config may leave 0 or null)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


SUPPRESSING = ("bad_words_ids", "suppress_tokens")
# generation_config.json's settings an encoder-decoder applies under another name in the artifact's record
APPLIED_AS = {"begin_suppress_tokens": "begin_suppressed"}
BEAM_SETTINGS = ("num_beams", "length_penalty", "early_stopping")


def _words(config: dict[str, Any], key: str) -> list[list[int]]:
    """``bad_words_ids`` (token sequences) or ``suppress_tokens`` (tokens) as sequences; [] where unset or malformed."""
    given = config.get(key) or []
    if not isinstance(given, list):
        return []
    words = [w if isinstance(w, list) else [w] for w in given]
    return words if all(isinstance(t, int) and not isinstance(t, bool) for w in words for t in w) else []


def _suppressed(config: dict[str, Any], vocab: int) -> list[int]:
    """The tokens an encoder-decoder never generates: one-token ``bad_words_ids`` (Marian's pad) and
    ``suppress_tokens`` (longer bad words are said unapplied)."""
    return sorted({w[0] for k in SUPPRESSING for w in _words(config, k) if len(w) == 1 and 0 <= w[0] < vocab})


def _sampling(given: Any, found: dict[str, Any]) -> dict[str, Any]:
    """The sampling defaults the artifact records: ``generate.sampling`` as given (null: none, greedy), or for
    ``auto`` the checkpoint's, said in the build's log where it samples or penalizes."""
    from ..models.hf import CheckpointError
    from ..runtime.sampling import Options, from_generation_config, recorded

    if given != "auto":
        if given is not None and not isinstance(given, dict):
            raise ConfigError(f"generate.sampling: {str(given)[:60]!r}: give auto (the checkpoint's), null (greedy) or "
                              "defaults such as {temperature: 0.7, top_p: 0.9}.")
        try:
            return recorded(given or {})
        except CallError as e:
            raise ConfigError(f"generate.sampling: {e}") from None
    try:
        defaults = from_generation_config(found["sampling"])
    except CallError as e:
        raise CheckpointError(f"{found['source']}: {e} Fix the file, or set generate.sampling (null: greedy).") from None
    if defaults:
        log.info("generate.sampling: %s from %s, for calls that leave them out (generate.sampling=null: greedy)",
                 Options(**defaults).described(), found["source"])
    return defaults


def entries(model: Any, model_name: str, params: Any, dims: dict[str, Any], buckets: dict[str, Any],
            max_profiles: int, generate: dict[str, Any], cache_dtype: str = "float32") -> tuple[dict[str, Entry], Spec]:
    """The two entries of a generation build, and what the artifact records for ``generate``. ``cache_dtype``: the
    build's precision (a bfloat16 model keeps its keys and values in bfloat16, half the cache of float32, and a
    float32 cache would be cast to it and back on every step)."""
    check_model(model, model_name)
    if seq2seq(model):
        return _seq2seq_entries(model, params, dims, buckets, max_profiles, generate, cache_dtype)
    batch, seq = dims["batch"], dims["seq"]
    max_length = generate["max_length"]
    marked = model.cache_shape(-1, max_length)  # -1 where the batch goes

    def entry(one_row: bool, seq_buckets: Any) -> Entry:
        inputs = model.extend_inputs(batch, seq, max_length, one_row, cache_dtype)
        # decode pads its batch by rows (each row is its own sequence); prefill's batch is the cache's, and its
        # ``row`` input must name a real row, which a padded call's proof (random row indices) cannot keep to
        rows = not one_row and isinstance(batch, NamedDimension)
        policy = {"batch": buckets.get("batch", DEFAULT_BUCKETS), "seq": seq_buckets}
        return Entry(model.extend, args=[params, *inputs.values()], padding={"batch": "rows"} if rows else None,
                     buckets={d: b for d, b in policy.items() if isinstance(dims[d], NamedDimension)},
                     max_profiles=max_profiles, donate=["cache"])
    searching = bool(generate.get("beams"))  # a decoder's reorder entry: built where its beams are asked for
    spec = Spec(PREFILL, DECODE, max_length, tuple(int(n) for n in marked), cache_dtype, int(model.vocab_size),
                tuple(generate.get("eos_token_id", ())), generate.get("pad_token_id"), dict(generate.get("sampling", {})),
                reorder=REORDER if searching else None, beams=dict(generate.get("beams") or {}))
    built = {PREFILL: entry(True, buckets.get("seq", DEFAULT_BUCKETS)), DECODE: entry(False, wide_chunks(seq))}
    if searching:
        built[REORDER] = _reorder(model, batch, max_length, cache_dtype, buckets, max_profiles)
    return built, spec


def _seq2seq_entries(model: Any, params: Any, dims: dict[str, Any], buckets: dict[str, Any],
                     max_profiles: int, generate: dict[str, Any], cache_dtype: str) -> tuple[dict[str, Entry], Spec]:
    """An encoder-decoder's ``encode`` and ``decode`` (its ``step``) at the same profiles (batch and source length
    buckets): the runtime pads a batch of sources to one, and decodes at it."""
    batch, seq, max_length = dims["batch"], dims.get("seq"), generate["max_length"]
    sources = model.encode_inputs(batch, seq)
    steps = model.step_inputs(batch, seq, max_length, cache_dtype)
    used = {d for info in sources.values() for d in info.dimension_names.values()}
    policy = {"batch": buckets.get("batch", DEFAULT_BUCKETS), "seq": buckets.get("seq", DEFAULT_BUCKETS)}
    policy = {d: b for d, b in policy.items() if d in used}  # Whisper's sources are 3000 frames, no seq

    @functools.wraps(model.encode)
    def encoded(params: Any, *inputs: Any) -> dict[str, Any]:
        # in decode's dtype: a reduced precision casts an output back to the float32 function's dtype
        # (compiler/precision.py), and the float32 function computes the keys and values in float32
        return {"cross": [c.astype(cache_dtype) for c in model.encode(params, *inputs)["cross"]]}
    encode = Entry(encoded, args=[params, *sources.values()], buckets=policy, max_profiles=max_profiles)
    step = Entry(model.step, args=[params, *steps.values()], buckets=policy, max_profiles=max_profiles,
                 donate=["cache"])
    features = sources.get("input_features")  # a speech model's: its sources are features, not token ids
    spec = Spec(ENCODE, DECODE, max_length, tuple(int(n) for n in model.cache_shape(-1, max_length)), cache_dtype,
                int(model.vocab_size), tuple(generate.get("eos_token_id", ())), generate.get("pad_token_id"),
                dict(generate.get("sampling", {})), "seq2seq", int(model.decoder_start_token_id),
                generate.get("forced_bos_token_id"), generate.get("forced_eos_token_id"),
                tuple(generate.get("suppressed", ())), *(int(generate.get(k, 0)) for k in SEQ2SEQ_LIMITS), REORDER,
                dict(generate.get("beams") or {}), begin_suppressed=tuple(generate.get("begin_suppressed", ())),
                opening=dict(generate.get("opening") or {}), audio=dict(generate.get("audio") or {}),
                source_shape=tuple(features.shape_bounds.max[1:]) if features is not None else (),
                encoded_length=int(steps["encoder_mask"].shape_bounds.max[1]) if features is not None else 0,
                expand=EXPAND if features is not None else None)
    built = {ENCODE: encode, DECODE: step, REORDER: _reorder(model, batch, max_length, cache_dtype, buckets,
                                                             max_profiles)}
    if features is not None:
        built[EXPAND] = _expand(model, batch, seq, max_length, cache_dtype, buckets, max_profiles)
    return built, spec


def _expand(model: Any, batch: Any, seq: Any, max_length: int, cache_dtype: str, buckets: dict[str, Any],
            max_profiles: int) -> Entry:
    """The ``expand`` entry of a speech model: the cross-attention keys and values of ``sources`` rows (each source
    encoded once) gathered into ``batch`` rows (``rows[i]``: the source of row ``i``), on the device: a source's beams
    (``runtime/beams.py``) share one run of the encoder, whose 1500 positions cost most of a short reply (whisper-base's
    shape: 1.7 s of encoding at batch 4, against 0.5 at batch 1)."""
    if not isinstance(batch, NamedDimension):
        sources = batch
    else:
        sources = NamedDimension("sources", batch.min, batch.min, batch.max)
    axis = list(model.cross_shape(-1, 1)).index(-1)

    def expand(cross: Any, rows: Any) -> dict[str, Any]:
        return {"cross": [jnp.take(c, rows, axis=axis, mode="clip") for c in cross]}
    cross = model.cross_inputs(sources, seq, cache_dtype)
    rows = InputInfo((batch,), "int32", (0, getattr(batch, "max", batch)))
    bucketed = buckets.get("batch", DEFAULT_BUCKETS)
    policy = {"sources": bucketed, "batch": bucketed} if isinstance(batch, NamedDimension) else None
    return Entry(expand, args=[cross, rows], buckets=policy, max_profiles=max_profiles)


def _reorder(model: Any, batch: Any, max_length: int, cache_dtype: str, buckets: dict[str, Any],
             max_profiles: int) -> Entry:
    """The ``reorder`` entry: the cache (one array, or an encoder-decoder's list) with each row ``i`` replaced by row
    ``rows[i]`` (a gather, on the device; the cache donated), at the batch buckets: beam search's continuations
    (``runtime/beams.py``)."""
    axis = list(model.cache_shape(-1, max_length)).index(-1)

    def reorder(cache: Any, rows: Any) -> dict[str, Any]:
        return {"cache": jax.tree_util.tree_map(lambda c: jnp.take(c, rows, axis=axis), cache)}
    rows = InputInfo((batch,), "int32", (0, getattr(batch, "max", batch)))
    policy = {"batch": buckets.get("batch", DEFAULT_BUCKETS)} if isinstance(batch, NamedDimension) else None
    cache = model.cache_inputs(batch, max_length, cache_dtype) if seq2seq(model) else \
        InputInfo(model.cache_shape(batch, max_length), cache_dtype)
    return Entry(reorder, args=[cache, rows], buckets=policy, max_profiles=max_profiles, donate=["cache"])


def wide_chunks(seq: Any) -> list[int]:
    """The ``seq`` sizes of ``decode``: 1 (a step) and two prompt-chunk sizes, the longest prompt chunk and an
    eighth of it, so that prompts that start together are prefilled as one batch (a common prefix of 100
    tokens: 6 calls of 16 over every row, then 4 tokens per row through ``prefill``)."""
    hi = int(getattr(seq, "max", seq))
    return sorted({1, max(hi // 8, 1), hi})
