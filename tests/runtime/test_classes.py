"""``runtime/classes.py`` against transformers' text-classification pipeline: for the four kinds of sequence
classifier a ``config.json`` describes (one class of several: softmax; ``multi_label_classification``: sigmoid; a
single class, as a cross-encoder's relevance: sigmoid; ``regression``: the value as it is), the scores' function the
zoo model records (``output_scores``) is the one the pipeline picks, and given the same logits the classes and scores
are the pipeline's, for every ``top_k`` and ``function_to_apply``. A built classifier's ``classify()`` and the
server's ``classes`` output: ``tests/serve/test_text.py``."""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from examples.classifier_checkpoint import checkpoint  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.models import hf  # noqa: E402
from tripy_build.models.bert import Bert  # noqa: E402
from tripy_build.runtime.classes import FUNCTIONS, check, top  # noqa: E402

transformers.logging.set_verbosity_error()
TEXTS = ["the quick brown fox", "héllo wörld, the lazy dog jumps", "don't"]
KINDS = {"single_label": ({"id2label": {0: "negative", 1: "positive", 2: "neutral"}}, "softmax"),
         "multi_label": ({"id2label": {0: "toxic", 1: "insult", 2: "threat"},
                          "problem_type": "multi_label_classification"}, "sigmoid"),
         "one_class": ({"num_labels": 1}, "sigmoid"),
         "regression": ({"num_labels": 1, "problem_type": "regression"}, "none")}


@pytest.mark.parametrize("kind", list(KINDS))
def test_classes_and_scores_equal_the_pipelines(kind, tmp_path):
    config, function = KINDS[kind]
    path = checkpoint(tmp_path / kind, **config)
    model = hf.model_from_config(Bert, path)
    assert model.output_scores() == {"logits": function}
    labels = model.output_labels()["logits"]
    hf_model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    pipe = transformers.pipeline("text-classification", model=hf_model, tokenizer=hf_tok)
    with torch.no_grad():
        logits = hf_model(**hf_tok(TEXTS, padding=True, return_tensors="pt")).logits.numpy()
    for k in range(1, len(labels) + 1):
        for given in (None, *FUNCTIONS):
            want = pipe(TEXTS, top_k=k, function_to_apply=given)
            got = [top(row, labels, k, given or function) for row in logits]
            assert [[c["label"] for c in row] for row in got] == [[c["label"] for c in row] for row in want]
            assert np.allclose([c["score"] for row in got for c in row], [c["score"] for row in want for c in row],
                               rtol=0, atol=1e-6), (k, given)


def test_a_problem_type_is_checked_and_read_for_the_heads_it_scores(tmp_path):
    with pytest.raises(ValueError, match=r"problem_type='ranking' is not one of single_label_classification, "
                                         r"multi_label_classification, regression \(or null: by num_labels\)"):
        Bert(head="sequence_classification", problem_type="ranking")
    with pytest.raises(ValueError, match=r"problem_type=regression says how a classifier's logits are scored, and "
                                         r"head=token_classification has none"):
        Bert(head="token_classification", problem_type="regression")
    # a token classifier's checkpoint may carry one (the Trainer writes it): not read, nothing recorded
    path = checkpoint(tmp_path / "ner", transformers.BertForTokenClassification,
                      problem_type="single_label_classification")
    model = hf.model_from_config(Bert, path)
    assert model.problem_type is None and model.output_scores() == {}
    for bad, fragment in [((0, None), "top_k is how many classes to answer with, an integer in [1, 3], got 0"),
                          ((True, None), "got True"),
                          ((1, "tanh"), "function_to_apply 'tanh' is not one of softmax, sigmoid, none")]:
        with pytest.raises(CallError) as e:
            check(*bad, 3)
        assert fragment in str(e.value)
    with pytest.raises(CallError, match="logits hold NaN or infinity"):
        top(np.array([0.5, np.inf], np.float32), ["a", "b"], 1, "softmax")


def test_the_encoder_alone_from_a_classifiers_checkpoint_drops_its_classes(tmp_path):
    """``model.head=none`` (or ``model.pooling``) over a multi-label classifier's checkpoint builds the encoder alone:
    the checkpoint's num_labels, labels and problem_type go with its head, nothing recorded that would not act; given
    by hand under a head without classes, they are refused."""
    path = checkpoint(tmp_path / "multi", **KINDS["multi_label"][0])
    for given in ({"head": "none"}, {"pooling": "mean"}):
        model = hf.model_from_config(Bert, path, given)
        assert model.task == "none" and (model.num_labels, model.labels, model.problem_type) == (2, (), None)
        assert model.output_scores() == {} and model.output_labels() == {}
    with pytest.raises(ValueError, match=r"num_labels=3 and labels=\[\] size and name a classifier's classes, and "
                                         r"head=none has none"):
        Bert(head="none", num_labels=3)
