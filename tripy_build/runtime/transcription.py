"""What a Whisper artifact's decoder reads after its start token and before the reply, as transformers'
``WhisperGenerationMixin`` sets it: the language, the task and ``<|notimestamps|>`` (left out of a reply with
timestamps, ``runtime/longform.py``).

The build records the checkpoint's ``generation_config.json`` settings (``Opening.recorded``): ``forced_decoder_ids``
(the tokens at positions 1, 2, ...; whisper-tiny's ``[[1, null], [2, 50359]]``: a language to detect, then
``<|transcribe|>``), ``lang_to_id``, ``task_to_id``, ``no_timestamps_token_id`` and ``is_multilingual``, and a
fine-tune's ``language`` and ``task`` (what a call that leaves them out gets). A call's ``language`` and ``task``
replace them as transformers' ``_retrieve_init_tokens`` does:

- neither given: the forced tokens;
- ``language`` (a code such as ``"fr"``, its token ``"<|fr|>"``, or its name ``"french"``): that language's token at
  position 1 (a call of an English-only model that gives one is refused), and ``<|transcribe|>`` where no task
  follows;
- ``task`` (``"transcribe"`` or ``"translate"``, to English): its token;
- a multilingual model whose language is left open: detected per source from the logits of the start token, the
  most likely of the language tokens (transformers' ``detect_language``, which runs the decoder over the start token
  once more; here its logits are the first step's);
- then ``<|notimestamps|>``, where the checkpoint has it, for a reply without timestamps (a reply with them has
  none; its first timestamp is at most ``max_initial_timestamp_index`` in, also recorded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import CallError

TASKS = ("transcribe", "translate")
# Whisper's languages by name (its tokenizer's codes; names as transformers' TO_LANGUAGE_CODE takes them, aliases too)
_NAMES = ("en:english zh:chinese de:german es:spanish ru:russian ko:korean fr:french ja:japanese pt:portuguese "
          "tr:turkish pl:polish ca:catalan nl:dutch ar:arabic sv:swedish it:italian id:indonesian hi:hindi fi:finnish "
          "vi:vietnamese he:hebrew uk:ukrainian el:greek ms:malay cs:czech ro:romanian da:danish hu:hungarian ta:tamil "
          "no:norwegian th:thai ur:urdu hr:croatian bg:bulgarian lt:lithuanian la:latin mi:maori ml:malayalam cy:welsh "
          "sk:slovak te:telugu fa:persian lv:latvian bn:bengali sr:serbian az:azerbaijani sl:slovenian kn:kannada "
          "et:estonian mk:macedonian br:breton eu:basque is:icelandic hy:armenian ne:nepali mn:mongolian bs:bosnian "
          "kk:kazakh sq:albanian sw:swahili gl:galician mr:marathi pa:punjabi si:sinhala km:khmer sn:shona yo:yoruba "
          "so:somali af:afrikaans oc:occitan ka:georgian be:belarusian tg:tajik sd:sindhi gu:gujarati am:amharic "
          "yi:yiddish lo:lao uz:uzbek fo:faroese ht:haitian_creole ps:pashto tk:turkmen nn:nynorsk mt:maltese "
          "sa:sanskrit lb:luxembourgish my:myanmar bo:tibetan tl:tagalog mg:malagasy as:assamese tt:tatar haw:hawaiian "
          "ln:lingala ha:hausa ba:bashkir jw:javanese su:sundanese yue:cantonese my:burmese ca:valencian nl:flemish "
          "ht:haitian lb:letzeburgesch ps:pushto pa:panjabi ro:moldavian ro:moldovan si:sinhalese es:castilian "
          "zh:mandarin")
CODES = {name.replace("_", " "): code for code, name in (pair.split(":") for pair in _NAMES.split())}
DETECT = -1  # the language's place in an opening where it is to be detected


@dataclass(frozen=True)
class Opening:
    """A checkpoint's opening settings (the build's record: ``Spec.opening``)."""

    forced: tuple[int | None, ...] = ()  # forced_decoder_ids' tokens from position 1 (None: the language, detected)
    languages: Mapping[str, int] | None = None  # lang_to_id: "<|en|>" -> 50259; None: the checkpoint has none
    tasks: Mapping[str, int] | None = None  # task_to_id
    no_timestamps: int | None = None  # no_timestamps_token_id
    multilingual: bool | None = None  # is_multilingual (None: not said)
    # the language and task a fine-tune's config sets for calls that leave them out (transformers' fine-tuning
    # guides set generation_config.language and .task, and forced_decoder_ids null)
    language: str | None = None
    task: str | None = None
    # max_initial_timestamp_index: a reply with timestamps starts at most this many timestamp tokens (of 0.02 s) in
    # (whisper's configs: 50, one second; None: anywhere)
    max_initial: int | None = None

    @classmethod
    def from_generation_config(cls, config: Mapping[str, Any], vocab: int) -> "Opening":
        """From ``generation_config.json``'s settings; a ``CallError`` naming the key where one is malformed (an id
        outside the vocabulary, ``forced_decoder_ids`` that skip a position)."""
        def token(value: Any, key: str) -> int:
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
                raise CallError(f"generation_config.json's {key}: {value!r} is not a token id in [0, {vocab}).")
            return value

        def table(key: str) -> dict[str, int] | None:
            given = config.get(key)
            if given is None:
                return None
            if not isinstance(given, dict):
                raise CallError(f"generation_config.json's {key}: expected an object of token ids, got {given!r:.60}.")
            return {str(k): token(v, f"{key}[{k!r}]") for k, v in given.items()}
        forced = []
        for i, pair in enumerate(config.get("forced_decoder_ids") or []):
            if not (isinstance(pair, list) and len(pair) == 2 and pair[0] == i + 1):
                raise CallError(f"generation_config.json's forced_decoder_ids: {config['forced_decoder_ids']!r:.80} "
                                "does not force positions 1, 2, ... in turn (Whisper's prompt).")
            forced.append(None if pair[1] is None else token(pair[1], "forced_decoder_ids"))
        stamp = config.get("no_timestamps_token_id")
        multilingual = config.get("is_multilingual")
        named = {k: config.get(k) for k in ("language", "task")}
        for key, value in named.items():
            if value is not None and not isinstance(value, str):
                raise CallError(f"generation_config.json's {key}: {value!r:.60} is not a string (one {key} for every "
                                "call; a list per source is not read).")
        initial = config.get("max_initial_timestamp_index")
        if initial is not None and (not isinstance(initial, int) or isinstance(initial, bool) or initial < 0):
            raise CallError(f"generation_config.json's max_initial_timestamp_index: {initial!r:.40} is not a count of "
                            "timestamp tokens (a non-negative integer; whisper's is 50: one second).")
        out = cls(tuple(forced), table("lang_to_id"), table("task_to_id"),
                  None if stamp is None else token(stamp, "no_timestamps_token_id"),
                  None if multilingual is None else bool(multilingual), named["language"], named["task"], initial)
        out.tokens()  # its own language and task must be among its tables
        return out

    @classmethod
    def of(cls, recorded: Mapping[str, Any]) -> "Opening":
        """From the artifact's record (``recorded``)."""
        return cls(tuple(recorded.get("forced") or ()), recorded.get("languages"), recorded.get("tasks"),
                   recorded.get("no_timestamps"), recorded.get("multilingual"), recorded.get("language"),
                   recorded.get("task"), recorded.get("max_initial"))

    def recorded(self) -> dict[str, Any]:
        out = {"forced": list(self.forced), "languages": self.languages, "tasks": self.tasks,
               "no_timestamps": self.no_timestamps, "multilingual": self.multilingual, "language": self.language,
               "task": self.task, "max_initial": self.max_initial}
        return {k: v for k, v in out.items() if v not in (None, [])}

    def tokens(self, language: str | None = None, task: str | None = None, timestamps: bool = False) -> list[int]:
        """The tokens after the start token for a call's ``language`` and ``task`` (None: the checkpoint's), with
        ``DETECT`` where the language is to be detected, and ``<|notimestamps|>`` last unless the reply is to have
        ``timestamps``; a ``CallError`` naming what this model takes where the language or task is not one of its
        own, or where it has no timestamps."""
        if self.multilingual is False and (language is not None or task is not None):
            raise CallError(f"generate(): language={language!r}, task={task!r}: this Whisper is English-only "
                            "(is_multilingual false): it transcribes English; leave language and task out.")
        language = self.language if language is None else language
        task = self.task if task is None else task
        out = list(self.forced) if language is None and task is None else []
        if language is not None:
            out[:1] = [self._language(language)]
        elif self.languages and (not out or out[0] is None):
            out[:1] = [DETECT]
        if task is not None:
            if task not in TASKS or not self.tasks or task not in self.tasks:
                raise CallError(f"generate(): task={task!r}: this model's tasks are "
                                f"{', '.join(map(repr, self.tasks or {})) or 'none (its generation config has no task_to_id)'}.")
            out.append(self.tasks[task])
        elif language is not None and self.tasks and not set(out) & set(self.tasks.values()):
            out.append(self.tasks["transcribe"])
        if timestamps:
            if self.no_timestamps is None:
                raise CallError("generate(): return_timestamps=True: this model's generation config has no "
                                "no_timestamps_token_id, so its timestamp tokens are not known; leave it out.")
            out = out[:-1] if out and out[-1] == self.no_timestamps else out
        elif self.no_timestamps is not None and (not out or out[-1] != self.no_timestamps):
            out.append(self.no_timestamps)
        return [t for t in out if t is not None]

    def _language(self, language: str) -> int:
        if not self.languages:
            raise CallError(f"generate(): language={language!r}: this model's generation config has no lang_to_id, "
                            "so it takes no language; leave it out.")
        given = language.strip().lower()
        token = given if given.startswith("<|") else f"<|{CODES.get(given, given)}|>"
        if token not in self.languages:
            codes = ", ".join(t[2:-2] for t in self.languages)
            raise CallError(f"generate(): language={language!r} is not one of this model's languages; give a code "
                            f"(or its name: french for fr) among: {codes}.")
        return self.languages[token]

    def detected(self, logits: np.ndarray) -> np.ndarray:
        """Each row's language token: the most likely of ``languages`` in the start token's ``logits [rows, vocab]``."""
        ids = np.array(sorted(self.languages.values()), np.int64)
        return ids[np.argmax(logits[:, ids], axis=-1)]


def check_features(spec: Any, features: Any) -> list[np.ndarray]:
    """A call's ``input_features`` (``[batch, num_mel_bins, frames]``, or one source ``[num_mel_bins, frames]``) as one
    float32 array per source; a ``CallError`` naming the shape expected or the source with a value that is not finite."""
    x = np.asarray(features)
    if x.ndim == len(spec.source_shape):
        x = x[None]
    if x.ndim != len(spec.source_shape) + 1 or tuple(x.shape[1:]) != tuple(spec.source_shape) or not len(x):
        raise CallError(f"generate(): input_features has shape {tuple(x.shape)}; this model takes [batch, "
                        f"{', '.join(map(str, spec.source_shape))}] (the log-mel features of 30 seconds of audio: "
                        "transcribe(audio) makes them, or transformers' WhisperFeatureExtractor).")
    if not np.issubdtype(x.dtype, np.floating):
        raise CallError(f"generate(): input_features has dtype {x.dtype}; the features are floats.")
    bad = np.flatnonzero(~np.isfinite(x).reshape(len(x), -1).all(axis=1))
    if bad.size:
        raise CallError(f"generate(): input_features[{int(bad[0])}] holds a value that is not finite (NaN or inf).")
    return [row.astype(np.float32) for row in x]


def prompt_ids(tokenizer: Any, spec: Any, text: str, where: str = "") -> list[int]:
    """A prompt ``text`` as a speech model's ``prompt_ids``: ``<|startofprev|>``, then the text's tokens with a leading
    space, as transformers' ``WhisperProcessor.get_prompt_ids`` makes them; a ``CallError`` (its message after
    ``where``) where the text holds a special token or the tokenizer has no ``<|startofprev|>``."""
    if not isinstance(text, str):
        raise CallError(f"{where}prompt must be a text, got {type(text).__name__}.")
    start = tokenizer.token_id("<|startofprev|>")
    if start is None:
        raise CallError(f"{where}prompt: this model's tokenizer has no <|startofprev|> token, which a prompt opens "
                        "with; leave prompt out.")
    ids = tokenizer.encode_rendered(" " + text.strip())
    special = [t for t in ids if t >= min(spec.eos_token_id or (spec.vocab_size,))]
    if special:
        raise CallError(f"{where}prompt={text[:60]!r} holds special tokens (ids {special[:5]}: Whisper's <|...|> "
                        "tokens); a prompt is plain text.")
    return [start, *ids]


def room(spec: Any, prompt: Sequence[int], opening: Sequence[int], where: str = "") -> int:
    """The new tokens a reply has room for after a ``prompt`` and the ``opening`` (``Spec.room``); a ``CallError`` (its
    message after ``where``) where the prompt leaves none."""
    left = spec.room(0, len(prompt) + len(opening))
    if left < 1:
        raise CallError(f"{where}prompt: its {len(prompt)} tokens and the {len(opening)} of the reply's opening leave "
                        f"no room for a reply in the decoder's generate.max_length={spec.max_length} positions; "
                        "shorten the prompt.")
    return left
