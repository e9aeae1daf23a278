"""``runtime/entities.py`` against transformers' token-classification pipeline (``pipeline("ner")``): given the same
logits, the same entities, words, characters and scores for every aggregation strategy, over the three kinds of
tokenizers NER checkpoints have: WordPiece (BERT's: ``##`` marks a word's later pieces, ``[UNK]``), byte-level BPE
(RoBERTa's, Qwen's: no marks, transformers' rule of thumb for words) and sentencepiece-style (XLM-RoBERTa's: ``▁``).
The artifact-level path (a built token classifier, both loaders, the server) is ``tests/serve/test_entities.py``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from examples.chat_checkpoint import tokenizer as byte_level  # noqa: E402
from examples.classifier_checkpoint import checkpoint as wordpiece  # noqa: E402
from test_tokenizer import ours, sentencepiece  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.runtime.entities import STRATEGIES, Grouping, find  # noqa: E402

transformers.logging.set_verbosity_error()
LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC", 5: "MISC"}  # MISC: a tag without B-/I-
TEXTS = ["the quick brown fox jumps over the lazy dog", "héllo wörld, the lazy dog jumps", "don't stop me now, fox!",
         "xyzzy qwerty fox 😀 done", "  two  spaces"]


@pytest.fixture(scope="module", params=["wordpiece", "byte_level", "sentencepiece"])
def classifier(request, tmp_path_factory):
    """A tokenizer saved as a checkpoint's, and a BertForTokenClassification of random weights over it (six
    classes)."""
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "wordpiece":
        wordpiece(path, transformers.BertForTokenClassification, id2label=LABELS)
    else:
        (byte_level if request.param == "byte_level" else sentencepiece)(path)
        vocab = len(transformers.AutoTokenizer.from_pretrained(path))
        torch.manual_seed(0)
        transformers.BertForTokenClassification(transformers.BertConfig(
            vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
            id2label=LABELS)).eval().save_pretrained(path)
    model = transformers.AutoModelForTokenClassification.from_pretrained(path).eval()
    # the logits pushed toward a cycle of labels by position, so that every grouping rule meets its case: B- then I-
    # of one tag, two B- of one tag, a tag without B-/I-, O between entities
    cycle = torch.zeros(64, len(LABELS))
    cycle[torch.arange(64), torch.tensor([3, 4, 4, 0, 1, 1, 2, 5, 5, 4, 2] * 6)[:64]] = 2.5
    model.classifier.register_forward_hook(lambda module, args, out: out + cycle[:out.shape[1]])
    return path, model, transformers.AutoTokenizer.from_pretrained(path)


def test_entities_equal_the_pipelines_for_every_aggregation_strategy(classifier):
    path, model, hf_tok = classifier
    tok, labels = ours(path), [LABELS[i] for i in range(len(LABELS))]
    logits = {}
    with torch.no_grad():
        for text in TEXTS:
            logits[text] = model(**hf_tok(text, return_tensors="pt")).logits[0].numpy()
    for strategy in STRATEGIES:
        pipe = transformers.pipeline("token-classification", model=model, tokenizer=hf_tok,
                                     aggregation_strategy=strategy)
        for text in TEXTS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # transformers' "Tokenizer does not support real words"
                want = pipe(text)
            padded = np.concatenate([logits[text], np.full((3, len(labels)), 7.0, np.float32)])  # past the text: unread
            got = find(tok, text, tok.spans(text), padded, labels, Grouping(strategy))
            assert [{k: v for k, v in e.items() if k != "score"} for e in got] == \
                   [{k: (int(v) if k == "index" else v) for k, v in e.items() if k != "score"} for e in want], \
                   (strategy, text)
            assert np.allclose([e["score"] for e in got], [float(e["score"]) for e in want], rtol=0, atol=1e-6)
            assert all(text[e["start"]:e["end"]] for e in got)
    every = [find(tok, t, tok.spans(t), logits[t], labels, Grouping(s, ())) for t in TEXTS for s in ("none", "first")]
    assert sum(map(len, every[1::2])) < sum(map(len, every[::2])) - 3, "the cases grouping is for were not tried"
    # ignore_labels: the pipeline's, compared by tag after grouping and by label without it
    pipe = transformers.pipeline("token-classification", model=model, tokenizer=hf_tok, aggregation_strategy="simple",
                                 ignore_labels=["PER"])
    text = TEXTS[0]
    got = find(tok, text, tok.spans(text), logits[text], labels, Grouping("simple", ("PER",)))
    assert [e["word"] for e in got] == [e["word"] for e in pipe(text)] and {e["entity_group"] for e in got} != {"PER"}


def test_what_cannot_be_grouped_is_refused_naming_it(classifier):
    path, _, _ = classifier
    tok, labels = ours(path), list(LABELS.values())
    spans = tok.spans("the fox")
    logits = np.zeros((len(spans.ids), len(labels)), np.float32)
    logits[-1, 2] = np.nan
    with pytest.raises(CallError, match=r"logits for the text 'the fox' hold NaN or infinity"):
        find(tok, "the fox", spans, logits, labels, Grouping())
    with pytest.raises(CallError, match=r"aggregation_strategy 'words' is not one of none, simple, first, average, max"):
        Grouping("words")
    with pytest.raises(CallError, match=r"ignore_labels must be a list of class names \(\['O'\]\), got 'O'"):
        Grouping("simple", "O")
