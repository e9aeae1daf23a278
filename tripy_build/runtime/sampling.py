"""How a generated token is picked from the model's logits: the options, the artifact's defaults for them, and the
``Sampler`` that applies them, numpy only.

The logits of each row go, in Hugging Face's and vLLM's order, through OpenAI's ``logit_bias`` (where a request
gives one), the penalties (``repetition_penalty`` over
the prompt and the tokens generated so far, as transformers' ``RepetitionPenaltyLogitsProcessor``; then OpenAI's
``frequency_penalty`` and ``presence_penalty`` over the generated tokens, as vLLM applies them), then, where
``temperature`` is above 0, ``softmax(logits / temperature)`` cut to the ``top_k`` most likely tokens, to the
fewest most likely whose probabilities add up to ``top_p``, and to those at least ``min_p`` times as likely as
the most likely (transformers' warpers, in its order), and a token is drawn with a seeded generator: the same
seed, the same tokens. ``temperature`` 0 takes the most likely token after the penalties.

An artifact records the defaults of the options a call leaves out (``metadata["generate"]["sampling"]``, from
``generate.sampling``: by default the checkpoint's ``generation_config.json`` as transformers' ``generate``
reads it): Qwen2.5's instruct models sample at temperature 0.7, top_p 0.8, top_k 20 with a repetition penalty
of 1.05, and are served so unless a request says otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import CallError


@dataclass(frozen=True)
class Options:
    """How tokens are picked; each field's neutral value leaves the logits as they are."""

    temperature: float = 0.0  # 0: the most likely token (greedy); above 0: sample from softmax(logits / temperature)
    top_k: int = 0  # sample among the k most likely tokens only; 0: every token
    top_p: float = 1.0  # then among the fewest most likely whose probabilities add up to top_p; 1: every token
    min_p: float = 0.0  # then among those at least min_p times as likely as the most likely; 0: every token
    repetition_penalty: float = 1.0  # the logit of a token in the prompt or the reply: divided by it (times it if < 0)
    frequency_penalty: float = 0.0  # subtracted from a token's logit once per time the reply holds it
    presence_penalty: float = 0.0  # subtracted from the logit of each token the reply holds

    # the options an artifact may record defaults for (generation_config.json's); the two others are OpenAI's, per call
    RECORDED = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")

    def __post_init__(self) -> None:
        checks = {"temperature": (lambda v: v >= 0, "0 (greedy) or a positive number"),
                  "top_k": (lambda v: v >= 0, "a count of tokens, 0 for every token"),
                  "top_p": (lambda v: 0 < v <= 1, "a probability in (0, 1] (1: every token)"),
                  "min_p": (lambda v: 0 <= v <= 1, "a fraction in [0, 1] (0: every token)"),
                  "repetition_penalty": (lambda v: v > 0, "a positive number (1: none; above 1 discourages repeats)"),
                  "frequency_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2] (0: none)"),
                  "presence_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2] (0: none)")}
        for name, (ok, what) in checks.items():
            value = getattr(self, name)
            whole = name == "top_k"
            kind = (isinstance(value, (int, np.integer)) if whole else isinstance(value, (int, float, np.number))
                    and np.isfinite(value))
            if isinstance(value, bool) or not kind or not ok(value):
                raise CallError(f"{name}={value!r}: it is {'an integer, ' if whole else ''}{what}.")
            object.__setattr__(self, name, int(value) if whole else float(value))

    @classmethod
    def of(cls, defaults: dict[str, Any] | None = None, **given: Any) -> "Options":
        """A call's options: those it gives (None: not given) over the artifact's ``defaults`` over the neutral
        values. An option that does not exist is refused by name."""
        unknown = [k for k in [*(defaults or {}), *given] if k not in NAMES]
        if unknown:
            raise CallError(f"{unknown[0]!r} is not a sampling option; they are {', '.join(NAMES)}.")
        return cls(**{**(defaults or {}), **{k: v for k, v in given.items() if v is not None}})

    def described(self) -> str:
        """``temperature=0.7 top_k=20`` ...: the options that are not neutral (``greedy`` where none are)."""
        neutral = Options()
        said = [f"{f.name}={getattr(self, f.name):g}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(neutral, f.name)]
        return " ".join(said) if self.temperature else " ".join(["greedy", *said])

    def needs_history(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


NAMES = tuple(f.name for f in dataclasses.fields(Options))


def recorded(defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` (some of ``Options.RECORDED``) checked and as an artifact records them; what they leave out
    stays neutral (greedy, where ``temperature`` is left out)."""
    extra = [k for k in defaults if k not in Options.RECORDED]
    if extra:
        raise CallError(f"{extra[0]!r} is not a default an artifact records; those are {', '.join(Options.RECORDED)}.")
    options = Options(**defaults)
    return {k: getattr(options, k) for k in Options.RECORDED if k in defaults}


def from_generation_config(config: dict[str, Any]) -> dict[str, Any]:
    """The defaults transformers' ``generate`` takes from a ``generation_config.json``: where it says ``do_sample``,
    its ``temperature``, ``top_k``, ``top_p`` and ``min_p`` (unset: transformers' 1.0, 50, 1.0 and none), else none
    of them (the most likely token); its ``repetition_penalty`` either way."""
    def get(key: str, default: Any) -> Any:
        value = config.get(key)
        return default if value is None else value

    out = {}
    if config.get("do_sample"):
        out = {"temperature": get("temperature", 1.0), "top_k": get("top_k", 50), "top_p": get("top_p", 1.0),
               "min_p": get("min_p", 0.0)}
    if get("repetition_penalty", 1.0) != 1.0:
        out["repetition_penalty"] = config["repetition_penalty"]
    return recorded(out)


class Sampler:
    """Picks each row's next token by ``options``; keeps what the penalties need of each row (its prompt's tokens,
    those it generated) from ``prompts`` (one per row, in the order of the logits' rows).

    A step costs what the kept tokens cost, not the vocabulary's sort: ``top_k`` is a partition, and the nucleus
    of ``top_p`` is found among the most likely 64 tokens, then 256, ... (the first set whose probabilities add up
    to ``top_p`` holds it), so Qwen's 151,936 logits are not sorted per token.
    """

    FIRST = 64  # the most likely tokens the nucleus is first looked for among

    def __init__(self, options: Options, seed: int | np.random.Generator | None = None,
                 prompts: Sequence[np.ndarray] = (), constraints: Sequence[Any] | None = None,
                 bias: dict[int, float] | None = None):
        self.options = options
        self.rng = np.random.default_rng(seed)
        self.constraints = constraints  # per row, a grammar.Constraint (or None): the tokens it allows
        # OpenAI's logit_bias: added to these tokens' logits before anything else (as vLLM adds it)
        self.bias = None if not bias else (np.fromiter(bias, np.int64), np.fromiter(bias.values(), np.float64))
        self.prompts = self.replies = None
        if options.needs_history():
            self.prompts = [np.unique(np.asarray(p, np.int64)) for p in prompts]
            self.replies: list[list[int]] = [[] for _ in prompts]

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """The next token of each row, int32 ``[rows]``, from ``[rows, vocab]`` logits."""
        scores = self._penalized(logits)
        if self.options.temperature == 0.0:
            tokens = np.argmax(scores, axis=-1).astype(np.int32)
        else:
            u = self.rng.random(len(scores))
            tokens = np.array([ids[min(int((np.cumsum(p) < u[row]).sum()), len(ids) - 1)]
                               for row, (ids, p) in enumerate(map(self._candidates, scores))], np.int32)
        if self.replies is not None:
            for row, token in enumerate(tokens):
                self.replies[row].append(int(token))
        for row, constraint in enumerate(self.constraints or ()):
            if constraint is not None and not constraint.ended:
                constraint.advance(tokens[row])
        return tokens

    def ended(self) -> np.ndarray | bool:
        """Per row, whether its grammar can take no more tokens (the reply is whole; its row's tokens from then on
        are not its own: a caller stops or fills it); False for every row where there is no grammar."""
        if not self.constraints:
            return False
        return np.array([c is not None and c.ended for c in self.constraints], bool)

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """Each row's distribution the next token is drawn from (``temperature`` above 0), float64 ``[rows, vocab]``."""
        out = np.zeros(logits.shape, np.float64)
        for row, (ids, p) in enumerate(map(self._candidates, self._penalized(logits))):
            out[row, ids] = p
        return out

    def _candidates(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One row's tokens that may be drawn, in vocabulary order, and their probabilities (adding up to 1)."""
        o = self.options
        x = scores / o.temperature
        ids = np.arange(x.size)
        if 0 < o.top_k < x.size:  # the k largest, and any tied with the k-th (transformers keeps those)
            kth = x[np.argpartition(x, -o.top_k)[-o.top_k:]].min()
            ids = np.flatnonzero(x >= kth)
        p = _softmax(x[ids])
        if o.top_p < 1.0:  # a token stays while the tokens more likely than it hold less than top_p
            m = min(self.FIRST, p.size)
            while True:
                top = np.argpartition(p, -m)[-m:] if m < p.size else np.arange(p.size)
                ranked = top[np.argsort(-p[top], kind="stable")]
                if m == p.size or p[ranked].sum() >= o.top_p:
                    break
                m = min(4 * m, p.size)
            kept = ranked[np.cumsum(p[ranked]) - p[ranked] < o.top_p]
            kept.sort()
            ids, p = ids[kept], _normalized(p[kept])
        if o.min_p > 0.0:
            kept = p >= o.min_p * p.max()
            ids, p = ids[kept], _normalized(p[kept])
        return ids[p > 0], p[p > 0]  # none a grammar masked out, whatever the draw's rounding

    def _penalized(self, logits: np.ndarray) -> np.ndarray:
        out = logits.astype(np.float64)
        if self.bias is not None:
            out[:, self.bias[0]] += self.bias[1]
        for row, constraint in enumerate(self.constraints or ()):
            if constraint is not None and not constraint.ended:
                out[row] = constraint.mask(out[row])
        if self.replies is None:
            return out
        o = self.options
        for row in range(len(out)):
            reply, counts = np.unique(np.asarray(self.replies[row], np.int64), return_counts=True)
            if o.repetition_penalty != 1.0:
                ids = np.union1d(self.prompts[row], reply)
                hit = out[row, ids]
                out[row, ids] = np.where(hit < 0, hit * o.repetition_penalty, hit / o.repetition_penalty)
            out[row, reply] -= o.frequency_penalty * counts + o.presence_penalty
        return out


def _softmax(x: np.ndarray) -> np.ndarray:
    return _normalized(np.exp(x - x.max(axis=-1, keepdims=True)))


def _normalized(p: np.ndarray) -> np.ndarray:
    return p / p.sum(axis=-1, keepdims=True)
