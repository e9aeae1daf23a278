"""``runtime/zero_shot.py`` against transformers' zero-shot-classification pipeline: for NLI checkpoints of both
class orders the Hub has (roberta-large-mnli's contradiction, neutral, entailment; DeBERTa-v3 zero-shot models'
entailment, neutral, contradiction) and one without an entailment class (the pipeline's fallback: the last), given
the pairs' logits, the labels' order and scores are the pipeline's, competing or each on its own (``multi_label``,
a single candidate). A built classifier's ``zero_shot()`` with both loaders: ``tests/serve/test_text.py``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from examples.classifier_checkpoint import checkpoint  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.runtime.zero_shot import TEMPLATE, candidates, scored  # noqa: E402

transformers.logging.set_verbosity_error()
TEXT = "the quick brown fox jumps over the lazy dog"
ORDERS = {"mnli": {0: "contradiction", 1: "neutral", 2: "entailment"},
          "zeroshot": {0: "entailment", 1: "neutral", 2: "contradiction"},
          "unnamed": {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}}


@pytest.mark.parametrize("order", list(ORDERS))
def test_zero_shot_scores_equal_the_pipelines(order, tmp_path):
    path = checkpoint(tmp_path / order, id2label=ORDERS[order], label2id={v: k for k, v in ORDERS[order].items()},
                      initializer_range=0.2)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    pipe = transformers.pipeline("zero-shot-classification", model=model, tokenizer=tok)
    classes = [ORDERS[order][i] for i in range(3)]
    entail = next((i for i, c in enumerate(classes) if c.startswith("entail")), -1)
    for labels, template in ((["lazy", "quick", "brown", "dog"], TEMPLATE), (["fox"], "It is about {}")):
        with torch.no_grad():
            logits = model(**tok([TEXT] * len(labels), [template.format(x) for x in labels], padding=True,
                                 return_tensors="pt")).logits.numpy()
        for multi in (False, True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = pipe(TEXT, candidate_labels=labels, hypothesis_template=template, multi_label=multi)
            ranked, scores = scored(logits, labels, entail, multi)
            assert ranked == want["labels"], (order, labels, multi)
            assert np.allclose(scores, want["scores"], rtol=0, atol=1e-6)
            assert multi or len(labels) == 1 or abs(sum(scores) - 1) < 1e-6


def test_candidates_are_read_as_the_pipeline_reads_them():
    assert candidates(" sports, politics ,,art", TEMPLATE) == ["sports", "politics", "art"]
    for given, template, fragment in [([], TEMPLATE, "candidate_labels must be a non-empty list of label names"),
                                      ([3], TEMPLATE, "got [3]"),
                                      (["art"], "It is about art.", "hypothesis_template 'It is about art.' has no {}")]:
        with pytest.raises(CallError) as e:
            candidates(given, template)
        assert fragment in str(e.value)
    with pytest.raises(CallError, match="logits hold NaN or infinity"):
        scored(np.array([[0.0, np.nan, 1.0]], np.float32), ["a"], 2, False)
