"""One artifact served: its v2 metadata, requests decoded and checked, batched, answered, its statistics.

An artifact built with ``task=generate`` is served by ``/generate`` and ``/generate_stream`` (token ids in and out);
its entries (``prefill``, ``decode``: a step each, with the cache and the positions among their inputs) are
``/generate``'s internals, kept off ``/infer`` and out of the metadata unless ``expose_entries`` asks for them.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np

from ..core.signature import Parameter, declared, defaults
from ..errors import CallError, ConfigError, TripyBuildError
from ..runtime import classes, zero_shot
from ..runtime.texts import LONGER
from . import batching
from .codec import datatype, from_json_data, length_prefixed, metadata_shape, quote as _quote, ranges, to_json_data
from .outputs import (Wanted, answer, classes_info, entities_info, hypotheses_asked, prefixed, stride_asked, wanted,
                      zero_shot_info)
from .request import InputTensor, check

log = logging.getLogger(__name__)
TEXT = "text"  # the BYTES input that stands for a text model's token ids on /infer (``Endpoint.from_text``)
EMBEDDINGS = ("sentence_embedding", "text_embeds")  # outputs /v1/embeddings serves: model.pooling's, CLIP's text tower's
TEXT_PAIR = "text_pair"  # beside it, each row's second text (a cross-encoder's passage, an NLI model's hypothesis)


class Texts(NamedTuple):
    """A request's texts (its BYTES input ``text``) and their tokens (``Tokenizer.spans``); with a ``stride`` (its
    ``entities`` output's parameter), each text's windows instead (``Tokenizer.windows``: a list of spans per text);
    with ``hypotheses`` (its ``zero_shot`` output's), each text with each candidate's hypothesis, text by text."""

    texts: list[str]
    spans: list[Any]
    stride: int | None = None
    hypotheses: Any = None


class Prepared(NamedTuple):
    """A request checked: its calls (each the flat inputs of one call of the model: one, unless its texts run as
    windows or with hypotheses), the outputs it asks for, and its texts where it sent them (None)."""

    calls: list[list[np.ndarray]]
    wanted: list[Wanted]
    texts: Texts | None


LOADERS = ("auto", "runtime", "jax")  # which loader serves an artifact (``loader_for``)
LOADER_NAMES = {"runtime": "tripy_build.runtime (no jax)", "jax": "tripy_build.load (jax)"}


def loader_for(manifest: Any, loader: str = "auto") -> str:
    """Which loader serves an artifact: ``runtime`` (``tripy_build.runtime``: no jax, the fastest start; a GPU's
    executables through jax's CUDA plugin, a path not yet run on a card) or ``jax`` (``tb.load``: every platform jax
    drives). ``auto``: ``jax`` for an artifact with a CUDA program on a host with a GPU (until the runtime's GPU path
    has run on one), or one without a CPU program, or where the runtime was not tested on this jaxlib; else
    ``runtime`` (and for a manifest that cannot be read: the runtime's load says what is wrong with it)."""
    from .. import host
    from ..runtime.runtime import platform_for

    if loader not in LOADERS:
        raise ConfigError(f"serve --loader {loader!r}: must be one of {', '.join(LOADERS)}.")
    if loader != "auto" or manifest is None:
        return "runtime" if loader == "auto" else loader
    if platform_for(manifest) == "cuda" or "cpu" not in manifest.platforms or not host.tested_jax():
        return "jax"
    return "runtime"


class Endpoint:
    """One artifact served under its name: its metadata, requests decoded, batched and answered."""

    def __init__(self, model: Any, version: str, path: Path | None = None, batch_dim: str = "auto",
                 max_batch: int | None = None, max_delay_ms: float = 0.0, expose_entries: bool = False,
                 loader: str = "runtime"):
        """``model``: either loader's (``runtime.Runtime`` or ``Executable``: ``__name__``, ``flat_args``,
        ``output_infos``, ``output_names``, ``dims``, ``call_flat``, ``check_flat``, ``needs_compile``,
        ``wait_warmed``, ``generation_steps``); ``Endpoint.load`` makes one of an artifact, ``loader`` its name.
        ``expose_entries``: serve a ``task=generate`` artifact's first entry on ``/infer`` too, and describe its
        inputs and outputs in the metadata (they are ``/generate``'s internals: its cache, its positions)."""
        self.runtime, self.path, self.version, self.loader = model, path, version, loader
        self.name = getattr(model, "model_name", model.__name__)
        self.args = model.flat_args
        self.outputs = model.output_infos
        self.output_names = model.output_names
        self.plan, self.batching = batching.plan(self.args, self.outputs, model.dims, batch_dim, max_batch,
                                                 max_delay_ms)
        self.batcher = batching.Batcher(model.call_flat, self.plan, self.name, getattr(model, "needs_compile", None))
        self.last_inference_ms = 0
        self.generator = None  # the running batch of /generate (an artifact built with task=generate)
        if getattr(model, "can_generate", False):
            from .generation import Generator

            steps = model.generation_steps()
            self.generator = Generator(steps, steps.spec(), self.name)
        # the checkpoint's tokenizer, where the artifact stores one: text in and out (text_input, OpenAI's API)
        self.tokenizer = self._tokenizer(model)
        # a speech model (Whisper's: its sources are audio features) that decodes its replies: OpenAI's
        # /v1/audio/transcriptions and /v1/audio/translations (serve/audio.py); it takes no text, nor token ids
        self.transcribes = (self.tokenizer is not None and self.generator is not None
                            and bool(self.generator.spec.source_shape))
        # text in and out of a generate artifact: text_input on /generate, OpenAI's chat and completions
        self.chats = self.tokenizer is not None and self.generator is not None and not self.transcribes
        # the output OpenAI's /v1/embeddings serves from text: an encoder's sentence embedding (model.pooling), a CLIP
        # text tower's projection (text_embeds); None where there is none
        self.embeds = next((n for n in EMBEDDINGS if n in self.output_names), None) \
            if self.tokenizer is not None and self.generator is None else None
        # texts on /infer: a BYTES input named "text" stands for the token ids (a classifier: text in, labels out)
        self.takes_text = (self.tokenizer is not None and self.generator is None and TEXT not in dict(self.args)
                           and "input_ids" in dict(self.args))
        # whether /infer (gRPC's ModelInfer) runs the artifact: a generate artifact's entry only when asked for
        self.infer_served = self.generator is None or expose_entries
        self.labels = getattr(model, "labels", {})  # a classifier's class names per output (config.json's id2label)
        # derived outputs of /infer (serve/outputs.py): a token classifier's entities in texts; a sequence or image
        # classifier's scored classes (the scores' function the build chose, "" where the model is no such classifier)
        from ..runtime.entities import token_labels

        self.finds_entities = self.takes_text and self._read(token_labels, model) is not None
        scored = self._read(classes.class_labels, model)
        self.scores_classes = scored[1] if scored is not None else ""
        # a cross-encoder (one class) taking texts: the relevance of documents to a query, /v1/rerank (serve/rerank.py)
        self.reranks = self.takes_text and bool(self.scores_classes) and len(self.labels.get("logits", ())) == 1
        # a sequence classifier of two classes or more taking texts: an NLI model's zero-shot classification
        self.zero_shots = self.takes_text and bool(self.scores_classes) and len(self.labels.get("logits", ())) >= 2

    @staticmethod
    def _read(labels: Callable[[Any], Any], model: Any) -> Any:
        """What ``labels`` reads of ``model`` (``entities.token_labels``: a token classifier's class names;
        ``classes.class_labels``: a sequence or image classifier's, and their scores' function), None where
        ``model`` is not that kind of classifier."""
        try:
            return labels(model)
        except CallError:
            return None

    def _tokenizer(self, model: Any) -> Any:
        """The tokenizer the artifact stores, or None: without one, or where it cannot be read here (the model
        still serves token ids; the log says why it takes no text)."""
        if not (getattr(model, "metadata", None) or {}).get("tokenizer"):
            return None
        try:
            return model.tokenizer
        except CallError as e:
            log.warning("model %s takes token ids only: %s", self.name, e)
            return None

    def routes(self, url: str) -> str:
        """What a client calls on this model, for the server's startup lines."""
        base = f"{url}/v2/models/{self.name}"
        if self.generator is None:
            text = f"; texts as a BYTES input {TEXT!r} instead of token ids" if self.takes_text else ""
            text += "; their entities as the output 'entities'" if self.finds_entities else ""
            text += "; scored classes as the output 'classes'" if self.scores_classes else ""
            text += "; candidate labels scored by entailment as the output 'zero_shot'" if self.zero_shots else ""
            text += f"; documents reranked by relevance to a query: POST {url}/v1/rerank" if self.reranks else ""
            text += f"; texts to embed: OpenAI's POST {url}/v1/embeddings with model {self.name!r}" if self.embeds else ""
            return f"POST {base}/infer; {self.batching}{text}"
        g = self.generator
        if g.spec.source_shape:
            return (f"OpenAI's POST {url}/v1/audio/transcriptions and {url}/v1/audio/translations with model "
                    f"{self.name!r} (a WAV file at {g.spec.audio.get('sampling_rate', 16000)} Hz of up to "
                    f"{g.spec.audio.get('chunk_length', 30)} s; requests that arrive together share decode steps, up "
                    f"to {g.buckets[-1]} a step)" if self.transcribes else
                    f"none: a speech model whose artifact stores no tokenizer (rebuild it from a checkpoint with its "
                    f"tokenizer saved beside it, then POST {url}/v1/audio/transcriptions)")
        text = (f"POST {base}/generate and {base}/generate_stream (token ids in and out; requests share decode "
                f"steps, up to {g.buckets[-1]} a step; a prompt plus its new tokens within {g.spec.max_length})"
                if not g.seq2seq else
                f"POST {base}/generate and {base}/generate_stream (token ids in and out; an encoder-decoder: requests "
                f"that arrive together share decode steps, up to {g.buckets[-1]} a step; a source of up to "
                f"{g.longest} tokens, up to {g.spec.max_length} new tokens)")
        if self.chats:
            text += (f"; text in and out: text_input on /generate, and OpenAI's POST {url}/v1/chat/completions and "
                     f"{url}/v1/completions with model {self.name!r}")
        if self.infer_served:
            text += f"; its {g.spec.prefill!r} entry on POST {base}/infer (--expose-entries), {self.batching}"
        return text

    @classmethod
    def load(cls, path: str | Path, loader: str = "auto", **options: Any) -> "Endpoint":
        """An artifact loaded by the loader ``loader_for`` picks (the jax-free runtime for CPU executables,
        ``tb.load`` for a GPU's), its version its build key. Its profiles warm up in the background (``ready`` says
        when that is done): the server answers at once, and reports itself ready sooner than a load that ran every
        profile first (BERT-base: 15.1 s against 36.5)."""
        from ..artifact.read import read_manifest

        path = Path(path)
        manifest = None  # read only where auto must choose: the loader reads it again (the runtime says what is wrong)
        if loader == "auto":
            try:
                manifest = read_manifest(path)
            except TripyBuildError:
                pass
        chosen = loader_for(manifest, loader)
        if chosen == "runtime":
            from .. import runtime

            model = runtime.load(path)
        else:
            from ..runtime.loader import load

            model = load(path)
        return cls(model, path.resolve().name, path, loader=chosen, **options)

    def ready(self, timeout: float | None = 0.0) -> bool:
        """Whether the model's background warm-up is done (``wait_warmed``), after waiting up to ``timeout``
        seconds for it (None: as long as it takes). Requests are answered before, but one may prepare the
        profile it needs itself (BERT-base: ~0.3 s) or share the cores with it."""
        wait = getattr(self.runtime, "wait_warmed", None)
        return wait is None or wait(timeout=timeout)

    def metadata(self) -> dict[str, Any]:
        def tensor(name: str, info: Any) -> dict[str, Any]:
            return {"name": name, "datatype": datatype(info.dtype), "shape": metadata_shape(info), "ranges": ranges(info)}

        head = {"name": self.name, "versions": [self.version], "platform": "tripy_build"}
        if not self.infer_served:
            g = self.generator
            inputs, outputs = self.generate_tensors()
            if not g.spec.source_shape:  # a speech model's input is its audio's features, of one shape
                inputs[0]["ranges"] = [{"name": "prompt", "min": 1,
                                        "max": g.longest if g.seq2seq else g.spec.max_length - 1}]
            return {**head, "inputs": inputs, "outputs": outputs, "generate": self._generate_info(), "batching": None,
                    "batching_note": f"generate requests share decode steps, up to {g.buckets[-1]} a step"}
        out = {**head, "inputs": [tensor(p, info) for p, info in self.args],
               "outputs": [tensor(n, info) for n, info in zip(self.output_names, self.outputs)],
               "batching": ({"dim": self.plan.dim, "max_batch": self.plan.max_batch,
                             "max_delay_ms": self.plan.max_delay_s * 1e3} if self.plan else None),
               "batching_note": self.batching}
        if self.labels:  # a classifier's class names, by output; an output's "classification": k answers with them
            out["labels"] = self.labels
        if self.takes_text:  # texts instead of token ids, tokenized here
            out["text_input"] = {"name": TEXT, "datatype": "BYTES", "shape": [-1], "stands_for": [
                n for n in ("input_ids", "attention_mask", "token_type_ids") if n in dict(self.args)],
                                 "pair": TEXT_PAIR}
        if self.finds_entities:  # an output of texts' entities, asked for by name
            out["entities"] = entities_info()
        if self.scores_classes:  # an output of each row's scored classes, asked for by name
            out["classes"] = classes_info(self.scores_classes)
        if self.zero_shots:  # an output of texts' candidate labels by score (an NLI model's), asked for by name
            out["zero_shot"] = zero_shot_info()
        if self.generator is not None:  # its entry exposed (expose_entries)
            out.update(entry=self.generator.spec.prefill, generate=self._generate_info())
        return out

    def text(self) -> Any:
        """The tokenizer that takes a request's text; a ``CallError`` where the artifact stores none."""
        if self.tokenizer is None:
            raise CallError(f"model {self.name!r} takes and gives token ids only (its checkpoint had no tokenizer.json): "
                            'send "input_ids", or rebuild from a checkpoint with its tokenizer saved beside it.')
        return self.tokenizer

    def from_text(self, text: InputTensor, pair: InputTensor | None, given: int,
                  asked: list[tuple[Any, Any]]) -> tuple[list[list[np.ndarray]], Texts]:
        """An inference's calls from its ``text`` input: BYTES ``[n]`` (or ``[n, 1]``), one text per row (with
        ``text_pair``, as many second texts: each row the two as one sequence, as ``tokenizer(text, text_pair)``
        joins a cross-encoder's query and passage), tokenized by the checkpoint's tokenizer and padded as
        ``text_rows`` pads them, in one call; and the texts. ``given``: how many inputs the request has; ``asked``: the
        outputs it asks for (name, parameters). Where those ask ``entities`` for a ``stride``
        (``outputs.stride_asked``), each text in windows of the build's ``seq`` (``Tokenizer.windows``); where they
        ask for ``zero_shot`` (``outputs.hypotheses_asked``), each text with each candidate label's hypothesis as a
        pair; every window or pair a row, in as many calls as they need."""
        if given != 1 + (pair is not None):
            raise CallError(f"input {TEXT!r} stands for input_ids, attention_mask and token_type_ids (the texts "
                            f"tokenized): send it alone (or with {TEXT_PAIR!r}), or send token ids instead of it.")
        texts = _texts(text)
        pairs = _texts(pair) if pair is not None else [None] * len(texts)
        if len(pairs) != len(texts):
            raise CallError(f"input {TEXT_PAIR!r} has {len(pairs)} texts and {TEXT!r} {len(texts)}: give one second "
                            "text per text.")
        stride, hypotheses = stride_asked(self, asked), hypotheses_asked(self, asked)
        if (stride is not None or hypotheses is not None) and pair is not None:
            raise CallError(f"output {'entities' if stride is not None else 'zero_shot'!r} runs each text as rows of "
                            f"its own: send {TEXT!r} alone, without {TEXT_PAIR!r}.")
        if hypotheses is not None:
            pairs, named = zero_shot.hypotheses(texts, hypotheses.labels, hypotheses.template)
            spans = [self.tokenizer.spans(t, h) for t, h in pairs]
            return self.text_rows([s.ids for s in spans], [s.type_ids for s in spans], named), \
                Texts(texts, spans, hypotheses=hypotheses)
        if stride is not None:
            longest = dict(self.args)["input_ids"].shape_bounds.max[1]
            windows = [self.tokenizer.windows(t, longest, stride) for t in texts]
            flat = [w for ws in windows for w in ws]
            return self.text_rows([w.ids for w in flat], [w.type_ids for w in flat], "window {}".format), \
                Texts(texts, windows, stride)
        spans = [self.tokenizer.spans(t, p) for t, p in zip(texts, pairs)]
        fix = 'send shorter texts, ask output "entities" with a "stride" to find entities in windows of them, or build ' \
              "with a longer shapes.dims.seq" if self.finds_entities and pair is None else LONGER
        calls = self.text_rows([s.ids for s in spans], [s.type_ids for s in spans], fix=fix)
        if len(calls) > 1:
            most = dict(self.args)["input_ids"].shape_bounds.max[0]
            raise CallError(f"input {text.name!r}: {len(texts)} texts, but model {self.name!r} takes at most {most} rows "
                            "a call (the build's batch range): send at most that many.")
        return calls, Texts(texts, spans)

    def text_rows(self, rows: list[list[int]], types: list[list[int]] | None = None,
                  named: Callable[[int], str] = "input {}".format, fix: str = LONGER) -> list[list[np.ndarray]]:
        """Texts' token ids as the model's flat inputs, in calls of at most the batch dim's size: ``input_ids``
        padded with the tokenizer's pad id to the longest of the call (or the build's fixed width), ``attention_mask``
        0 there, ``token_type_ids`` the rows' ``types`` (a pair's), the other inputs as a request that leaves them out
        gets them (``runtime/texts.padded_calls``); each call checked against the declared ranges. ``named``: how an
        error names the row at an index; ``fix``: what it says to do with a row too long."""
        from ..runtime.texts import padded_calls

        calls = []
        for given in padded_calls(self.tokenizer, rows, types, dict(self.args)["input_ids"].shape_bounds, named,
                                  f"model {self.name!r}", fix):
            leaves = self.in_order((n, lambda info, a=a: a) for n, a in given.items() if n in dict(self.args))
            self.runtime.check_flat(*leaves)
            calls.append(leaves)
        return calls

    def generate_tensors(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """A generate artifact's inputs and outputs as its clients send and get them (``/generate``'s body; a speech
        model's: the features its audio's file is made into, ``serve/audio.py``)."""
        spec = self.generator.spec
        given = ({"name": "input_features", "datatype": "FP32", "shape": list(spec.source_shape)} if spec.source_shape
                 else {"name": "input_ids", "datatype": "INT32", "shape": [-1]})
        return [given], [{"name": "output_ids", "datatype": "INT32", "shape": [-1]}]

    def _generate_info(self) -> dict[str, Any]:
        from .generation import OPTIONS

        spec = self.generator.spec
        base = f"/v2/models/{self.name}"
        routes = [f"POST {base}/generate", f"POST {base}/generate_stream"] if not spec.source_shape else []
        if self.transcribes:
            routes += ["POST /v1/audio/transcriptions", "POST /v1/audio/translations"]
        if self.chats:
            routes += ["POST /v1/chat/completions", "POST /v1/completions"]
        info = {"routes": routes, "text": self.chats, "max_length": spec.max_length,
                "vocab_size": spec.vocab_size, "eos_token_id": list(spec.eos_token_id), "options": list(OPTIONS),
                "sampling": spec.sampling, **({"beams": spec.beams} if spec.beams else {})}
        if self.chats:  # what its chat template teaches: the tool-call format OpenAI's route reads, and thinking
            from ..runtime.harmony import speaks
            from ..runtime.reasoning import thinks
            from ..runtime.tools import format_of

            template = self.tokenizer.chat_template
            fmt = "harmony" if speaks(template) else getattr(format_of(template), "name", None)
            info.update(tools=fmt, thinking=fmt == "harmony" or thinks(template))
        return {**info, "entries": [spec.prefill, spec.decode]} if self.infer_served else info

    def not_served(self) -> str:
        """Why ``/infer`` refuses a generate artifact (``infer_served`` is False), and what to call instead."""
        spec = self.generator.spec
        if spec.source_shape:
            return (f"model {self.name!r} is a speech model: it takes audio on OpenAI's POST /v1/audio/transcriptions "
                    "and /v1/audio/translations (a WAV file, as multipart/form-data); its entries are not served on "
                    "/infer (start the server with --expose-entries to call its first entry there).")
        return (f"model {self.name!r} generates tokens: POST /v2/models/{self.name}/generate (or generate_stream) with "
                f'{{"input_ids": [464, 2068], "max_new_tokens": 20}} (HTTP); its {spec.prefill!r} and {spec.decode!r} '
                "entries, which take the cache and positions generation keeps, are not served on /infer (start the "
                "server with --expose-entries to call its first entry there).")

    def decode(self, request: Any, binary: memoryview) -> tuple[list[list[np.ndarray]], Texts | None]:
        """A request's calls (one: its flat inputs, in the model's order, each checked against its declaration; its
        texts may need more: as windows, or with hypotheses), and its texts, where it sent them instead of token ids."""
        if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
            raise CallError('the request must be a JSON object with an "inputs" list '
                            '(KServe v2: {"inputs": [{"name", "shape", "datatype", "data"}]}).')
        _parameters(request, "the request")
        if self.takes_text and any(isinstance(i, dict) and i.get("name") == TEXT for i in request["inputs"]):
            read, at = {}, 0
            for item in request["inputs"]:  # in the request's order: their binary data follows it
                if isinstance(item, dict) and item.get("name") in (TEXT, TEXT_PAIR) and item["name"] not in read:
                    tensor, after = self._tensor(item, binary, at)
                    read[item["name"]] = tensor
                    tensor.strings()
                    at = after()
            asked = request.get("outputs")
            asked = [(o.get("name"), o.get("parameters")) for o in asked if isinstance(o, dict)] \
                if isinstance(asked, list) else []
            calls, texts = self.from_text(read[TEXT], read.get(TEXT_PAIR), len(request["inputs"]), asked)
            if at != len(binary):
                raise CallError(f"the request carries {len(binary)} bytes of binary data but its text inputs' "
                                f"binary_data_size add up to {at}.")
            return calls, texts
        offset = 0

        def read(item: dict[str, Any]) -> Callable[[Any], np.ndarray]:
            def tensor(info: Any) -> np.ndarray:
                nonlocal offset
                typed, after = self._tensor(item, binary, offset)
                array = check(typed, info)
                offset = after()
                return array
            return tensor

        def named() -> Iterator[tuple[str, Callable[[Any], np.ndarray]]]:
            for item in request["inputs"]:
                if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                    raise CallError(f'every entry of "inputs" must be an object with a string "name", got {_quote(item)}.')
                yield item["name"], read(item)

        leaves = self.in_order(named())
        if offset != len(binary):
            raise CallError(f"the request carries {len(binary)} bytes of binary tensor data but its inputs' "
                            f"binary_data_size add up to {offset}.")
        self.runtime.check_flat(*leaves)
        return [leaves], None

    def in_order(self, named: Iterable[tuple[str, Callable[[Any], np.ndarray]]]) -> list[np.ndarray]:
        """A request's inputs in the model's flat order, from (name, its reader) pairs in the request's order: a
        reader makes the array from the input's ``InputInfo``. An unknown or repeated name is refused, a missing one
        too unless its ``InputInfo`` has a default (``token_type_ids``: zeros, sized by the inputs given).
        Every protocol's decoding goes through here; the values are checked against the ranges after it."""
        expected = {p: (i, info) for i, (p, info) in enumerate(self.args)}
        leaves: list[Any] = [None] * len(self.args)
        for name, read in named:
            if name not in expected:
                raise CallError(f"input {_quote(name)}: {self.name} has no such input; it takes "
                                f"{', '.join(repr(p) for p in expected)}.")
            index, info = expected[name]
            if leaves[index] is not None:
                raise CallError(f"input {name!r} is given twice; give it once.")
            leaves[index] = read(info)
        specs = dict(self.args)
        given = {p: v for (p, _), v in zip(self.args, leaves) if v is not None}
        filled = defaults({p: specs[p] for p in specs if p not in given},
                          [Parameter(p, "POSITIONAL_OR_KEYWORD", 0) for p in specs], given, specs.__getitem__)
        leaves = [filled.get(p) if v is None else v for (p, _), v in zip(self.args, leaves)]  # HF's defaults
        missing = [p for (p, _), v in zip(self.args, leaves) if v is None]
        if missing:
            raise CallError(f"{self.name} needs input(s) {', '.join(repr(m) for m in missing)}, which the request lacks "
                            f"(its inputs: {'; '.join(f'{p!r} {declared(i, datatype(i.dtype))}' for p, i in self.args)}).")
        return leaves

    @staticmethod
    def _tensor(item: dict[str, Any], binary: memoryview, offset: int) -> tuple[InputTensor, Callable[[], int]]:
        """One JSON input as the typed request's, and (once read) where the next input's binary data starts."""
        name = item["name"]
        size = _parameters(item, f"input {name!r}").get("binary_data_size")
        end = [offset]

        def values(dtype: np.dtype, count: int, want: str) -> np.ndarray:
            if size is not None:
                need = count * dtype.itemsize
                if isinstance(size, bool) or size != need or offset + need > len(binary):
                    raise CallError(f"input {name!r}: shape {item.get('shape')} of {want} is {need} bytes, but "
                                    f"binary_data_size is {_quote(size)} with {len(binary) - offset} bytes left in "
                                    "the request.")
                end[0] = offset + need
                return np.frombuffer(binary[offset:offset + need], dtype=dtype)
            if "data" not in item:
                raise CallError(f'input {name!r}: has neither "data" nor a "binary_data_size" parameter.')
            array = from_json_data(name, item["data"], dtype)
            if array.size != count:
                raise CallError(f"input {name!r}: shape {item.get('shape')} holds {count} values, but \"data\" has "
                                f"{array.size}.")
            return array.ravel()

        def strings() -> list[Any]:
            if size is not None:
                if isinstance(size, bool) or not isinstance(size, int) or offset + size > len(binary):
                    raise CallError(f"input {name!r}: binary_data_size {_quote(size)} with {len(binary) - offset} "
                                    "bytes left in the request.")
                end[0] = offset + size
                return length_prefixed(binary[offset:offset + size], name)
            data = item.get("data")
            return np.asarray(data, dtype=object).ravel().tolist() if isinstance(data, list) else [data]
        return (InputTensor(name, item.get("datatype"), item.get("shape"), values, strings=functools.cache(strings)),
                lambda: end[0])

    def prepare(self, request: Any, binary: memoryview) -> Prepared:
        """A request checked: its calls, the outputs it wants, its texts."""
        calls, texts = self.decode(request, binary)
        if "id" in request and not isinstance(request["id"], str):
            raise CallError(f'"id" must be a string, got {_quote(request["id"])}.')
        return Prepared(calls, self._wanted(request, texts), texts)

    def respond(self, request: dict[str, Any], prepared: Prepared,
                outs: list[list[np.ndarray]]) -> tuple[dict[str, Any], list[bytes]]:
        """The v2 response to a request (``outs``: each of its calls' outputs), and the binary output data that
        follows it. JSON ``data`` is left as arrays (see ``codec.to_json_data``) for a serializer that writes numpy
        arrays."""
        self.last_inference_ms = int(time.time() * 1000)
        response: dict[str, Any] = {"model_name": self.name, "model_version": self.version, "outputs": []}
        if "id" in request:
            response["id"] = request["id"]
        blobs = []
        for w in prepared.wanted:
            out = answer(self, w, outs, prepared.texts)
            strings = out.dtype == object
            entry: dict[str, Any] = {"name": w.name, "datatype": "BYTES" if strings else datatype(out.dtype),
                                     "shape": list(out.shape)}
            if w.binary:
                blob = prefixed(out) if strings else out.tobytes()
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = out.ravel().tolist() if strings else to_json_data(out)
            response["outputs"].append(entry)
        return response, blobs

    def infer(self, request: Any, binary: memoryview) -> tuple[dict[str, Any], list[bytes]]:
        """Run one request and wait for it: the v2 response, and the binary output data that follows it."""
        prepared = self.prepare(request, binary)
        futures = self.batcher.submit_all(prepared.calls)
        return self.respond(request, prepared, [f.result() for f in futures])

    def _wanted(self, request: dict[str, Any], texts: Texts | None) -> list[Wanted]:
        """The outputs to return: the requested ones (``outputs.wanted`` checks each), else all of the model's."""
        default = _parameters(request, "the request").get("binary_data_output", False)
        if not isinstance(default, bool):
            raise CallError(f'parameter "binary_data_output" must be true or false, got {_quote(default)}.')
        asked = request.get("outputs")
        if asked is None:
            return [Wanted(n, default) for n in self.output_names]
        if not isinstance(asked, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in asked):
            raise CallError(f'"outputs" must be a list of objects with a string "name", got {_quote(asked)}.')
        out = []
        for o in asked:
            params = _parameters(o, f"output {o['name']!r}")
            as_binary = params.get("binary_data", default)
            if not isinstance(as_binary, bool):
                raise CallError(f'output {o["name"]!r}: parameter "binary_data" must be true or false, '
                                f"got {_quote(as_binary)}.")
            out.append(wanted(self, o["name"], params, as_binary, texts))
        return out

    def statistics(self) -> dict[str, Any]:
        s = self.batcher.stats
        with s.lock:
            ok = s.requests - s.failed
            return {"name": self.name, "version": self.version, "last_inference": self.last_inference_ms,
                    "inference_count": s.rows, "execution_count": s.calls,
                    "inference_stats": {"success": {"count": ok}, "fail": {"count": s.failed},
                                        "queue": {"count": s.requests, "ns": s.queue_ns},
                                        "compute_infer": {"count": s.calls, "ns": s.compute_ns}},
                    "batch_stats": [{"batch_size": n, "compute_infer": {"count": c, "ns": ns}}
                                    for n, (c, ns) in sorted(s.batches.items())]}

    def close(self) -> None:
        self.batcher.close()
        if self.generator is not None:
            self.generator.close()


def _texts(tensor: InputTensor) -> list[str]:
    """A BYTES input's texts: shape ``[n]`` (or ``[n, 1]``), each element UTF-8."""
    name, shape = tensor.name, tensor.shape
    if tensor.datatype != "BYTES" or not (isinstance(shape, list) and 1 <= len(shape) <= 2 and all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape) and shape[1:] in ([], [1])):
        raise CallError(f"input {name!r}: BYTES of shape [n] (or [n, 1]), one text per row, got "
                        f"{_quote(tensor.datatype)} of shape {_quote(shape)}.")
    texts = tensor.strings()
    if len(texts) != shape[0]:
        raise CallError(f"input {name!r}: shape {shape} holds {shape[0]} texts, but its data has {len(texts)}.")
    try:
        texts = [t.decode() if isinstance(t, bytes) else t for t in texts]
    except UnicodeDecodeError:
        raise CallError(f"input {name!r}: a text is not UTF-8.") from None
    if not all(isinstance(t, str) for t in texts):
        raise CallError(f"input {name!r}: every element must be a string (a text), got {_quote(texts)}.")
    return texts


def _parameters(entry: dict[str, Any], what: str) -> dict[str, Any]:
    """An entry's ``parameters`` object ({} if absent)."""
    params = entry.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise CallError(f'{what}: "parameters" must be an object, got {_quote(params)}.')
    return params
