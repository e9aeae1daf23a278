"""The entries of a multi-entry artifact as both loaders expose them (``Executable`` on jax, ``Runtime``
without it), and what the entries share while they load.

A ``task=generate`` artifact is one: ``prefill`` and ``decode`` over one set of weights. Each entry is an
executable of its own; every one of them holds the same ``entries`` dict, and the first is the main one
(the artifact's top level, where its metadata is).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import numpy as np

from ..errors import CallError

SCORES = ("temperature", "avg_logprob", "compression_ratio", "no_speech_prob")  # a segment's window's reply's

_STEPS_LOCK = threading.Lock()


class Shared:
    """What the entries of one artifact share as they load: each weight file placed once, each prep program
    (over the same weight files) run once."""

    def __init__(self) -> None:
        self.placed: dict[str, Any] = {}  # weight file -> device array
        self.prepared: dict[tuple, Any] = {}  # (prep file, weight files) -> the prep program's outputs


class MultiEntry:
    """``entry(name)``, ``generate()`` and ``generation_steps()`` for both loaders. An instance sets ``entries`` (``{}`` for a
    single function) and ``_generation`` (None); its class provides what ``runtime/generate.Steps`` runs."""

    entries: dict[str, Any]
    _generation: Any
    artifact_dir: Any = None  # the directory the loaders read the artifact from (None: compiled in this process)
    _tokenizer: Any = None
    _warming: threading.Thread | None = None  # the background warm-up ``warm_up(background=True)`` started
    output_names: list[str]  # each flat output's name (the loader's property)

    @functools.cached_property
    def _output_index(self) -> dict[str, int]:
        """Each flat output's place by its name, for ``_step`` (``runtime/generate.Steps``: every decode step)."""
        return {n: i for i, n in enumerate(self.output_names)}

    def wait_warmed(self, timeout: float | None = None) -> bool:
        """Wait until the background warm-up (``load(..., warmup="background")``, the default) is done with
        every entry: each profile it prepares is prepared, and it no longer shares the cores with calls.

        Calls need not wait: one that needs a profile the warm-up has not reached prepares it itself. Wait
        before timing steady latency, or before a server reports itself ready, so that neither counts the
        warm-up's work (for BERT-base ~15 s after ``load`` on 2 cores).

        Args:
            timeout: seconds to wait at most; None: as long as it takes.

        Returns:
            True once no warm-up is running (also when none was started: ``warmup="now"`` or ``"none"``);
            False if ``timeout`` passed first.

        Example::

            rt = tripy_build.runtime.load("artifacts/bert/292b...")
            rt.wait_warmed(timeout=60)  # the warm-up no longer shares the cores with calls
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for e in (self.entries.values() if self.entries else [self]):
            thread = e._warming
            if thread is not None:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    return False
        return True

    @property
    def can_generate(self) -> bool:
        """Whether the artifact was built with ``task=generate`` (``generate`` works)."""
        return "generate" in self._main.metadata

    @property
    def labels(self) -> dict[str, list[str]]:
        """A classifier's class names per output, as the build recorded them (``metadata.labels``); {} where none."""
        labels = self._main.metadata.get("labels") or {}
        return {k: [str(x) for x in v] for k, v in labels.items() if isinstance(v, list)} if isinstance(labels, dict) else {}

    @property
    def scores(self) -> dict[str, str]:
        """How a classifier's classes are scored per output (``softmax``, ``sigmoid`` or ``none``), as the build
        recorded it (``metadata.scores``, from the checkpoint's ``problem_type`` and ``num_labels``); {} where none."""
        scores = self._main.metadata.get("scores") or {}
        return {k: v for k, v in scores.items() if isinstance(v, str)} if isinstance(scores, dict) else {}

    @property
    def model_name(self) -> str:
        """The model's name (the build's ``model.name``; the function's for an artifact saved from Python)."""
        main = self._main
        return str(main.metadata.get("model") or main.__name__) if self.entries else self.__name__

    def _check_count(self, leaves: Any, args: Any) -> None:
        """``call_flat``'s inputs are one per unbound flat input (``args``: ``flat_args``), in the same loaders' words."""
        if len(leaves) != len(args):
            raise CallError(f"{self.__name__}: call_flat takes {len(args)} inputs ({', '.join(p for p, _ in args)}), "
                            f"got {len(leaves)}.")

    @property
    def _main(self) -> Any:
        """The main entry (the artifact's top level): the first entry, or this executable if it is the only one."""
        return next(iter(self.entries.values())) if self.entries else self

    def entry(self, name: str) -> Any:
        """The entry called ``name`` of a multi-entry artifact (``entries`` lists them)."""
        if name not in self.entries:
            raise CallError(f"{self.__name__}: no entry {name!r}; its entries: "
                            f"{', '.join(map(repr, self.entries)) or 'none (a single function)'}.")
        return self.entries[name]

    def generate(self, input_ids: Any = None, max_new_tokens: int | None = None, *, attention_mask: Any = None,
                 temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 min_p: float | None = None, repetition_penalty: float | None = None,
                 frequency_penalty: float | None = None, presence_penalty: float | None = None,
                 seed: int | None = None, eos_token_id: Any = None, pad_token_id: int | None = None,
                 json_schema: dict[str, Any] | None = None, num_beams: int | None = None,
                 length_penalty: float | None = None, early_stopping: bool | str | None = None,
                 input_features: Any = None, language: str | None = None, task: str | None = None,
                 return_timestamps: bool | None = None, return_segments: bool = False,
                 compression_ratio_threshold: float | None = None, logprob_threshold: float | None = None,
                 no_speech_threshold: float | None = None, prompt_ids: Any = None) -> Any:
        """Generate tokens with an artifact built with ``task=generate`` (its prefill and decode entries);
        the same with both loaders (``tripy_build.runtime.load``: no jax).

        How each token is picked: the options given; those left out (None) take the artifact's defaults
        (``metadata["generate"]["sampling"]``: the checkpoint's ``generation_config.json`` as transformers'
        ``generate`` reads it, unless the build set ``generate.sampling``; greedy where it does not sample).

        An encoder-decoder's artifact (a ``*ForConditionalGeneration``: BART, T5) generates each reply to its source
        (``runtime/seq2seq.py``): the sources are encoded once, and the reply decoded from the decoder's start token.

        Args:
            input_ids: the prompts (an encoder-decoder's: the sources): a list of token-id lists (any lengths), or
                an int array ``[batch, prompt]`` whose padding (either side) ``attention_mask`` marks with 0.
            max_new_tokens: how many tokens to generate per prompt; the longest prompt plus these must fit
                in the artifact's ``generate.max_length`` (an encoder-decoder's: these alone; its sources fit
                the build's ``seq``).
            temperature: 0: greedy; above 0: sample from ``softmax(logits / temperature)``. A speech model's
                replies with timestamps also take a tuple, the temperatures of a window's attempts in turn: a
                reply that fails a threshold below is generated again at the next (transformers' and OpenAI's
                Whisper's fallback, e.g. ``(0.0, 0.2, 0.4, 0.6, 0.8, 1.0)``).
            top_k: sample among the ``top_k`` most likely tokens only; 0: every token.
            top_p: then among the fewest most likely tokens whose probabilities add up to ``top_p`` (nucleus
                sampling); 1: every token.
            min_p: then among the tokens at least ``min_p`` times as likely as the most likely; 0: every token.
            repetition_penalty: a token of the prompt or the reply has its logit divided by this (multiplied,
                where negative), as transformers' ``repetition_penalty``; 1: none.
            frequency_penalty, presence_penalty: OpenAI's: subtracted from a token's logit per time the reply
                holds it, and once if it holds it; in [-2, 2], 0 (the default): none.
            seed: the sampling's seed: the same seed, the same tokens.
            eos_token_id: a row stops after generating this id, or any of these ids (a list: an instruct model's
                end of text and end of turn); None (the default): the build's ``generate.eos_token_id``, which
                is the checkpoint's (``generation_config.json``) unless the build set it; ``[]``: every row
                generates ``max_new_tokens``.
            pad_token_id: what a stopped row is filled with (default: the checkpoint's pad id, else the first
                ``eos_token_id``).
            json_schema: hold each reply to this JSON schema (``{"type": "object"}``: any JSON object): at each
                step the tokens that cannot continue it are masked out (``runtime/grammar.py``, with the
                artifact's tokenizer), and a row stops once its JSON is whole.
            num_beams: each reply is the best of a beam search over this many beams (``runtime/beams.py``, as
                transformers' ``generate(num_beams=...)``): an encoder-decoder's, or a decoder's built with
                ``generate.beams``; 1: one token a step, picked by the options above. None: the artifact's
                ``generate.beams`` (its checkpoint's: BART's summarizers and Marian's translators search 4 to 6
                beams) for a call that picks tokens by score; one beam for a call that samples, penalizes or
                gives ``json_schema``.
            length_penalty: with beams, a finished reply's score is its log probability over its length to
                this power (above 1 favours longer replies); None: the artifact's, else 1.
            early_stopping: with beams, ``True``: a source is done once ``num_beams`` replies have ended;
                ``False``: once no running beam could beat them; ``"never"``: at the longest length. None: the
                artifact's, else False.
            input_features: a speech model's sources (Whisper's, in place of ``input_ids``): float32 ``[batch,
                num_mel_bins, 3000]``, the log-mel features of up to 30 seconds of audio each (``transcribe`` makes
                them from the audio); or of longer audio, ``[batch, num_mel_bins, frames]`` (``audio.LogMel.long``),
                transcribed window by window (``runtime/longform.py``), ``attention_mask [batch, frames]`` marking
                each source's frames, or a list of ``[num_mel_bins, frames]`` arrays of their own lengths.
            language: a speech model's: the language its replies are in (a code such as ``"fr"``, or its token
                ``"<|fr|>"``); None: the checkpoint's, or for a multilingual Whisper detected per source
                (``runtime/transcription.py``).
            task: a speech model's: ``"transcribe"``, or ``"translate"`` (to English); None: the checkpoint's.
            return_timestamps: a speech model's: each reply with Whisper's timestamp tokens (``<|0.00|>``, ...,
                ``runtime/timestamps.py``), the audio transcribed window by window as transformers' long-form
                generation does; ``max_new_tokens`` is then each window's most. None: where the features are longer
                than one window.
            return_segments: with timestamps, also each source's segments (a dict, below).
            compression_ratio_threshold: with timestamps: a window's reply whose tokens compress (zlib) by more than
                this repeats itself, and is generated again at the next temperature (transformers suggests 1.35).
            logprob_threshold: with timestamps: a window's reply whose mean log probability per token is below this
                is generated again at the next temperature (transformers suggests -1.0).
            no_speech_threshold: with timestamps and ``logprob_threshold``: a window whose reply is below
                ``logprob_threshold`` and whose ``<|nospeech|>`` probability after the start token is above this
                is silence, skipped without a segment (transformers suggests 0.6).
            prompt_ids: a speech model's: token ids its decoder reads before the start token of each reply (each
                window's): ``<|startofprev|>`` and a previous text's tokens, which steer its spelling and style
                (transformers' ``prompt_ids``; ``transcribe(prompt=text)`` makes them from a text).

        Returns:
            The new tokens, int32 ``[batch, n]``; ``n`` is ``max_new_tokens``, or less when every row stopped. With
            timestamps: each source's segments' tokens one after another (the end id left out); with
            ``return_segments``, ``{"sequences": those tokens, "segments": [[{"start", "end", "tokens",
            "temperature", "avg_logprob", "compression_ratio", "no_speech_prob"}, ...]]}`` per source, its times in
            seconds from the start of the audio, the others its window's reply's (``runtime/timestamps.Segment``).

        Example::

            gpt2 = tripy_build.load("artifacts/gpt2/1c2f...")
            new = gpt2.generate([[464, 2068, 318]], max_new_tokens=20)
            varied = gpt2.generate([[464, 2068, 318]], max_new_tokens=20, temperature=0.8, top_p=0.95, seed=1)
            bart = tripy_build.load("artifacts/bart/7a0e...")  # a summarizer: its checkpoint's 4 beams by default
            summaries = bart.generate(articles, max_new_tokens=142, num_beams=2, length_penalty=1.0)
        """
        from .beams import chosen
        from .generate import generate as decoder
        from .seq2seq import generate as encoder_decoder

        from .longform import Fallback

        fallback = Fallback.of(temperature, compression_ratio_threshold, logprob_threshold, no_speech_threshold)
        if fallback is not None and fallback.temperatures:
            temperature = fallback.temperatures[0]

        steps = self.generation_steps()
        spec = steps.spec()
        if max_new_tokens is None:
            raise CallError("generate(): give max_new_tokens, the most tokens to generate per prompt.")
        held = None
        if json_schema is not None:
            from .grammar import constraints

            held = constraints(self.tokenizer, json_schema, spec.vocab_size)
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                        repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty)
        batches = sorted({p["batch"] for p in steps.profiles(spec.decode)})
        beams = chosen(spec, batches, spec.options(**sampling), held, num_beams, length_penalty, early_stopping)
        if spec.kind == "seq2seq":
            return encoder_decoder(steps, spec, self.__name__, input_ids, max_new_tokens, attention_mask, seed,
                                   eos_token_id, pad_token_id, held, beams, input_features, language, task,
                                   return_timestamps, return_segments, fallback, prompt_ids, **sampling)
        speech = (input_features, language, task, return_timestamps or None, return_segments or None, fallback,
                  prompt_ids)
        if any(x is not None for x in speech) or input_ids is None:
            raise CallError(f"generate(): {self.__name__} is a decoder: give its prompts as input_ids (input_features, "
                            "language, task, return_timestamps, return_segments, prompt_ids, a tuple of temperatures "
                            "and the thresholds are a speech model's).")
        return decoder(steps, spec, self.__name__, input_ids, max_new_tokens, attention_mask, seed, eos_token_id,
                       pad_token_id, held, beams, **sampling)

    def transcribe(self, audio: Any, *, sampling_rate: int | None = None, language: str | None = None,
                   task: str | None = None, max_new_tokens: int | None = None, return_timestamps: bool = False,
                   prompt: str | None = None, **options: Any) -> list[Any]:
        """The text of each waveform, with a speech model's artifact (Whisper's, ``task=generate``): its log-mel
        features (``runtime/audio.LogMel``, as the checkpoint's ``preprocessor_config.json`` says), the reply
        generated (``generate``) and decoded by the stored tokenizer, its special tokens left out. Audio over 30
        seconds (a window), and any with a temperature fallback or its thresholds, is transcribed window by window
        with timestamps (``runtime/longform.py``), as transformers' long-form generation does.

        Args:
            audio: one waveform (mono floats in [-1, 1], of any length) or a list of them.
            sampling_rate: the audio's, which must be the model's (16000); None: taken to be.
            language, task: as ``generate`` takes them (None: the checkpoint's; a multilingual model detects
                the language of each waveform, in its first 30 seconds).
            max_new_tokens: the most tokens per reply (per window, with timestamps); None: all the decoder's
                positions leave.
            return_timestamps: each waveform's segments too, with their times.
            prompt: a text the decoder reads before each reply (a previous transcript, or the names and terms
                the audio holds, to steer their spelling): ``<|startofprev|>`` and the text's tokens, as
                transformers' ``processor.get_prompt_ids(prompt)`` makes them.
            options: ``generate``'s (``num_beams``, ``temperature``, the fallback's thresholds, ...).

        Returns:
            One text per waveform; with ``return_timestamps``, one ``{"text", "segments": [{"start", "end",
            "text", "temperature", "avg_logprob", "compression_ratio", "no_speech_prob"}, ...]}`` per waveform, the
            times in seconds from its start (to the hundredth: a feature frame), the others its window's reply's
            (``runtime/timestamps.Segment``).

        Example::

            whisper = tripy_build.runtime.load("artifacts/whisper/3f0c...")
            print(whisper.transcribe(waveform, language="en")[0])
            for s in whisper.transcribe(meeting, return_timestamps=True)[0]["segments"]:
                print(f"[{s['start']:.2f} -> {s['end']:.2f}]{s['text']}")
        """
        from .audio import LogMel
        from .generate import Spec, before_stop
        from .longform import Fallback
        from .transcription import Opening, prompt_ids, room

        spec = Spec.from_metadata(self.metadata, self.__name__)
        if not spec.source_shape:
            raise CallError(f"transcribe(): {self.__name__} is not a speech model; transcribe() is Whisper's "
                            "(model=whisper task=generate).")
        mel = LogMel(**spec.audio)
        waves = mel.waveforms(audio, sampling_rate, longer=True)
        fallback = Fallback.of(*(options.get(k) for k in ("temperature", "compression_ratio_threshold",
                                                           "logprob_threshold", "no_speech_threshold")))
        stamped = return_timestamps or fallback is not None or max(w.size for w in waves) > mel.n_samples
        before = None if prompt is None else prompt_ids(self.tokenizer, spec, prompt, "transcribe(): ")
        left = room(spec, before or (), Opening.of(spec.opening).tokens(language, task, stamped), "transcribe(): ")
        asked = dict(max_new_tokens=max_new_tokens or left, language=language, task=task, prompt_ids=before, **options)
        stops = spec.stops(options.get("eos_token_id"))
        if not stamped:
            ids = self.generate(input_features=mel(waves), **asked)
            return [self.tokenizer.decode(before_stop(row, stops)) for row in ids]
        features, frames = mel.long(waves)
        mask = (np.arange(features.shape[-1]) < frames[:, None]).astype(np.int32)
        long = len(waves) > 1 and features.shape[-1] > mel.frames  # else each source's window is used whole
        found = self.generate(input_features=features, attention_mask=mask if long else None,
                              return_timestamps=True, return_segments=True, **asked)
        begin = int(spec.opening["no_timestamps"]) + 1

        def text(tokens: Any) -> str:
            return self.tokenizer.decode([int(t) for t in tokens if t < begin])
        out = [{"text": text([t for s in segments for t in s["tokens"]]),
                "segments": [{"start": round(s["start"], 2), "end": round(s["end"], 2), "text": text(s["tokens"]),
                              **{k: s[k] for k in SCORES}} for s in segments]}
               for segments in found["segments"]]
        return out if return_timestamps else [o["text"] for o in out]

    def entities(self, texts: Any, *, aggregation_strategy: str = "simple", ignore_labels: Any = ("O",),
                 stride: int | None = None) -> list[list[dict[str, Any]]]:
        """The entities a token classifier (a ``*ForTokenClassification`` checkpoint built with its tokenizer) finds in
        each text, as transformers' token-classification pipeline answers (``runtime/entities.py``); the same with
        both loaders.

        Args:
            texts: a text, or a list of texts; each at most the build's ``seq`` tokens once tokenized, unless
                ``stride`` is given.
            aggregation_strategy: ``simple`` (the default): adjacent tokens of one tag joined into an entity;
                ``first``, ``average`` or ``max``: a word's tokens made to agree first; ``none``: every token.
            ignore_labels: the labels left out of the answer (``O``: outside any entity).
            stride: texts of any length, run in windows of the build's ``seq`` tokens, each repeating the last
                ``stride`` tokens of the one before; where the windows' entities overlap, the longer is kept (the
                pipeline's ``stride``; not with ``aggregation_strategy="none"``).

        Returns:
            A text's entities in order (for a list of texts, a list of them): ``{"entity_group", "score", "word",
            "start", "end"}`` (``none``: ``{"entity", "score", "index", "word", "start", "end"}``);
            ``text[start:end]`` is what each covers.

        Example::

            ner = tripy_build.runtime.load("artifacts/bert/8a1f...")  # model=hf params.checkpoint=bert-base-NER
            ner.entities("My name is Wolfgang and I live in Berlin")
            # [{'entity_group': 'PER', 'score': 0.99, 'word': 'Wolfgang', 'start': 11, 'end': 19},
            #  {'entity_group': 'LOC', 'score': 0.99, 'word': 'Berlin', 'start': 34, 'end': 40}]
        """
        from .entities import Grouping, of_texts
        from .texts import one_or_many

        grouping = Grouping(aggregation_strategy, ignore_labels)
        return one_or_many(lambda many: of_texts(self, many, grouping, stride), texts)

    def classify(self, texts: Any, *, top_k: int = 1, function_to_apply: str | None = None) -> list[Any]:
        """The classes a text classifier (a ``*ForSequenceClassification`` checkpoint built with its tokenizer: a
        sentiment, intent, toxicity model, a reranker) gives each text, with their scores, as transformers'
        text-classification pipeline answers (``runtime/classes.py``); the same with both loaders.

        Args:
            texts: a text, or a list of texts; each at most the build's ``seq`` tokens once tokenized. A text may
                be a pair, tokenized as one sequence (a cross-encoder's query and passage, an NLI model's premise
                and hypothesis): ``{"text": ..., "text_pair": ...}`` as the pipeline takes it, or ``(text, pair)``.
            top_k: how many classes to answer with, highest score first (1: the predicted class).
            function_to_apply: ``softmax``, ``sigmoid`` or ``none`` (the logits as they are); None (the default): the
                build's, from the checkpoint's ``problem_type`` (``multi_label_classification``: sigmoid;
                ``regression``: none) and ``num_labels`` (one class: sigmoid; more: softmax), as the pipeline picks.

        Returns:
            A text's ``top_k`` classes, ``[{"label", "score"}, ...]`` (for a list of texts, a list of them).

        Example::

            sentiment = tripy_build.runtime.load("artifacts/bert/3c9e...")  # distilbert-base-...-sst-2-english
            sentiment.classify(["a delight", "a bore"])
            # [[{'label': 'POSITIVE', 'score': 0.9998}], [{'label': 'NEGATIVE', 'score': 0.9997}]]
        """
        from .classes import of_texts
        from .texts import one_or_many

        return one_or_many(lambda many: of_texts(self, many, top_k, function_to_apply), texts)

    def zero_shot(self, texts: Any, candidate_labels: Any, *, hypothesis_template: str = "This example is {}.",
                  multi_label: bool = False) -> Any:
        """How well each of ``candidate_labels`` fits each text, by an NLI model (a ``*ForSequenceClassification``
        checkpoint of entailment and contradiction built with its tokenizer: roberta-large-mnli, a DeBERTa-v3
        zero-shot model), as transformers' zero-shot-classification pipeline answers (``runtime/zero_shot.py``); the
        same with both loaders.

        Args:
            texts: a text, or a list of texts; each paired with every candidate's hypothesis, each pair at most the
                build's ``seq`` tokens.
            candidate_labels: the labels to score: a list of names, or one comma-separated string.
            hypothesis_template: the hypothesis a label is put in (its ``{}``).
            multi_label: False: the labels compete (a softmax of their entailment logits); True: each is scored on
                its own (entailment against contradiction), so any number may fit.

        Returns:
            A text's ``{"sequence", "labels", "scores"}``, the labels by score, highest first (for a list of texts,
            a list of them).

        Example::

            nli = tripy_build.runtime.load("artifacts/deberta-v2/7b0c...")  # a DeBERTa-v3 zero-shot checkpoint
            nli.zero_shot("one day I will see the world", ["travel", "cooking", "dancing"])
            # {'sequence': 'one day I will see the world', 'labels': ['travel', 'dancing', 'cooking'],
            #  'scores': [0.97, 0.02, 0.01]}
        """
        from .texts import one_or_many
        from .zero_shot import of_texts

        return one_or_many(lambda many: of_texts(self, many, candidate_labels, hypothesis_template, multi_label), texts)

    def zero_shot_image(self, images: Any, candidate_labels: Any, *,
                        hypothesis_template: str = "This is a photo of {}.") -> Any:
        """How well each of ``candidate_labels`` fits each image, by CLIP (``model=clip`` built with its tokenizer:
        openai/clip-vit-base-patch32), as transformers' zero-shot-image-classification pipeline answers
        (``runtime/zero_shot.of_images``); the same with both loaders.

        Args:
            images: pixel values as CLIP's image processor makes them (resized, cropped, normalized): float
                ``[images, 3, 224, 224]``, or one image ``[3, 224, 224]``.
            candidate_labels: the labels to score: a list of names, or one comma-separated string.
            hypothesis_template: the text a label is put in (its ``{}``), as the pipeline's.

        Returns:
            An image's labels by score, highest first, ``[{"score", "label"}, ...]`` (a softmax of its similarity to
            each label's text); for several images, a list of them.

        Example::

            clip = tripy_build.runtime.load("artifacts/clip/2a4f...")
            clip.zero_shot_image(pixel_values, ["cat", "dog", "car"])
            # [{'score': 0.98, 'label': 'cat'}, {'score': 0.015, 'label': 'dog'}, {'score': 0.005, 'label': 'car'}]
        """
        from .zero_shot import of_images

        answers = of_images(self, images, candidate_labels, hypothesis_template)
        return answers[0] if np.ndim(images) == 3 else answers

    @property
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer, stored in the artifact (``runtime/tokenizer.Tokenizer``: ``encode``, ``decode``,
        ``chat``, ``stream``), read at first use; a ``CallError`` saying why where the artifact has none.

        Example::

            qwen = tripy_build.runtime.load("artifacts/qwen2/5d1e...")
            ids = qwen.tokenizer.chat([{"role": "user", "content": "Name three primes."}])
            print(qwen.tokenizer.decode(qwen.generate([ids], max_new_tokens=64)[0]))
        """
        from .stored_tokenizer import load

        main = self._main
        with _STEPS_LOCK:
            if main._tokenizer is None:
                main._tokenizer = load(main.artifact_dir, main.metadata.get("tokenizer") or [], self.__name__)
            return main._tokenizer

    def generation_steps(self) -> Any:
        """How ``runtime/generate.py`` runs this artifact's prefill and decode entries (the server's batch uses it):
        one per loaded artifact, holding the caches finished sessions leave for the next."""
        from .generate import Steps

        main = self._main
        with _STEPS_LOCK:
            if main._generation is None:
                main._generation = Steps(main)
            return main._generation
