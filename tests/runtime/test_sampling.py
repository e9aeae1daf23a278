"""``runtime/sampling``: the distribution a token is drawn from equals transformers' processors and warpers over
the same logits and history; the penalties as vLLM applies OpenAI's; the checkpoint's defaults as transformers'
``generate`` reads ``generation_config.json``."""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from tripy_build.errors import CallError  # noqa: E402
from tripy_build.runtime.sampling import Options, Sampler, from_generation_config  # noqa: E402

VOCAB = 40


def hugging_face(logits: np.ndarray, history: np.ndarray, o: Options) -> np.ndarray:
    """The distribution transformers' ``generate`` samples from: its processors, then its warpers, in its order."""
    chain = []
    if o.repetition_penalty != 1.0:
        chain.append(transformers.RepetitionPenaltyLogitsProcessor(o.repetition_penalty))
    chain.append(transformers.TemperatureLogitsWarper(o.temperature))
    if o.top_k:
        chain.append(transformers.TopKLogitsWarper(o.top_k))
    if o.top_p < 1:
        chain.append(transformers.TopPLogitsWarper(o.top_p))
    if o.min_p:
        chain.append(transformers.MinPLogitsWarper(o.min_p))
    scores, ids = torch.tensor(logits, dtype=torch.float64), torch.tensor(history)
    for step in chain:
        scores = step(ids, scores)
    return torch.softmax(scores, -1).numpy()


@pytest.mark.parametrize("options, vocab", [
    (Options(temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05), 40),  # Qwen2.5-Instruct's defaults
    (Options(temperature=0.6, top_p=0.9), 40),  # Llama 3 Instruct's
    (Options(temperature=1.3, min_p=0.1, repetition_penalty=1.4), 40),
    (Options(temperature=0.9, top_k=5, top_p=0.5, min_p=0.3, repetition_penalty=0.8), 40),
    (Options(temperature=2.0, top_p=0.95, presence_penalty=0.5), 3000),  # the nucleus beyond the first 64, 256
    (Options(temperature=0.5, top_p=0.5), 3000),
])
def test_the_distribution_equals_transformers_processors_and_warpers(options, vocab):
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(3, vocab)) * 3).astype(np.float32)
    prompts = [rng.integers(0, vocab, size=n) for n in (4, 9, 1)]
    sampler = Sampler(options, 0, prompts)
    history = [list(p) for p in prompts]
    for _ in range(3):  # the prompt's tokens, then the reply's too, are penalized
        want = np.stack([hugging_face(logits[r:r + 1], np.array([history[r]]), options)[0] for r in range(3)])
        if options.presence_penalty:  # not transformers': vLLM's, on the reply's tokens, before the warpers
            reply = [sorted(set(h[len(p):])) for h, p in zip(history, prompts)]
            shifted = logits.astype(np.float64).copy()
            for r, ids in enumerate(reply):
                shifted[r, ids] -= options.presence_penalty
            want = np.stack([hugging_face(shifted[r:r + 1], np.array([history[r]]), options)[0] for r in range(3)])
        got = sampler.probabilities(logits)
        np.testing.assert_allclose(got, want, atol=1e-12)
        if options.temperature == 2.0:
            assert ((got > 0).sum(-1) > 4 * Sampler.FIRST).all()  # the nucleus went past the first two looks
        for r, t in enumerate(sampler(logits)):
            assert want[r, t] > 0  # drawn from the tokens transformers keeps
            history[r].append(int(t))


def test_nucleus_sampling_draws_in_proportion_and_the_same_seed_draws_the_same():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    options = Options(temperature=1.0, top_p=0.75)  # 0.5 + 0.3 reach it: two tokens, in proportion 5:3
    drawn = np.array([Sampler(options, seed)(logits)[0] for seed in range(2000)])
    assert set(drawn) == {0, 1} and abs((drawn == 0).mean() - 0.625) < 0.04
    assert [Sampler(options, 5)(logits)[0] for _ in range(4)] == [Sampler(options, 5)(logits)[0]] * 4


def test_greedy_takes_the_most_likely_token_after_the_penalties():
    """vLLM's penalties (OpenAI's definitions): ``frequency_penalty`` per time the reply holds a token,
    ``presence_penalty`` once; the prompt is not counted. Greedy picks the argmax of what they leave."""
    logits = np.array([[5.0, 4.4, 4.05, 0.0]])
    prompt = [np.array([0, 0, 0])]
    assert Sampler(Options(frequency_penalty=2.0), None, prompt)(logits)[0] == 0  # the prompt is not counted
    sampler = Sampler(Options(frequency_penalty=0.3, presence_penalty=0.2), None, prompt)
    # token 0's 5 is 4.5 after one 0, 4.2 after two, 3.9 after three; token 1's 4.4 is 3.9 after one 1
    assert [int(sampler(logits)[0]) for _ in range(5)] == [0, 0, 1, 0, 2]
    repeat = Sampler(Options(repetition_penalty=2.0), None, [np.array([1])])
    assert [int(repeat(logits)[0]) for _ in range(3)] == [0, 2, 0]  # 1: 4.4 / 2 (the prompt); 0: 5 / 2; 2: 4.05 / 2


def test_defaults_from_generation_config_as_transformers_reads_them():
    qwen = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    assert from_generation_config(qwen) == {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.0,
                                            "repetition_penalty": 1.05}
    # unset under do_sample: transformers' defaults (top_k 50); without do_sample its sampling keys do nothing
    assert from_generation_config({"do_sample": True, "temperature": 0.6, "top_p": 0.9}) == {
        "temperature": 0.6, "top_k": 50, "top_p": 0.9, "min_p": 0.0}
    assert from_generation_config({"temperature": 0.6, "top_p": 0.9}) == {}
    assert from_generation_config({"repetition_penalty": 1.3}) == {"repetition_penalty": 1.3}
    assert Options.of({"temperature": 0.7, "top_k": 20}, temperature=0.0, top_k=None) == Options(top_k=20)


@pytest.mark.parametrize("given, fragment", [
    ({"temperature": -1}, "temperature=-1: it is 0 (greedy) or a positive number"),
    ({"top_k": 2.5}, "top_k=2.5: it is an integer, a count of tokens"),
    ({"top_p": 0}, "top_p=0: it is a probability in (0, 1]"),
    ({"top_p": True}, "top_p=True"),
    ({"min_p": 1.5}, "min_p=1.5: it is a fraction in [0, 1]"),
    ({"repetition_penalty": 0}, "repetition_penalty=0: it is a positive number"),
    ({"presence_penalty": 2.5}, "presence_penalty=2.5: it is a number in [-2, 2]"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty=nan"),
    ({"typical_p": 0.9}, "'typical_p' is not a sampling option; they are temperature, top_k"),
])
def test_a_bad_option_is_refused_naming_it_and_its_range(given, fragment):
    with pytest.raises(CallError) as e:
        Options.of({}, **given)
    assert fragment in str(e.value)
