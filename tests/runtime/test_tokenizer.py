"""``runtime/tokenizer.py`` against Hugging Face's own tokenizer (``transformers.AutoTokenizer``) on tokenizers saved with
``save_pretrained``, of both kinds checkpoints have: byte-level BPE (GPT-2, Llama 3, Qwen) with a ChatML template, and
sentencepiece-style (Llama 2, Gemma: a ``▁`` for spaces, a BOS added by the post-processor) with a template that
writes the BOS itself and refuses a system message. Encoding, decoding, the chat template and the streamed text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from examples.chat_checkpoint import CORPUS, tokenizer as byte_level  # noqa: E402
from tripy_build.errors import CallError  # noqa: E402
from tripy_build.runtime.tokenizer import FILES, Tokenizer  # noqa: E402

transformers.logging.set_verbosity_error()

LLAMA2 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not "
          "supported') }}{% endif %}{% generation %}[{{ m['role'] }}] {{ m['content'] | trim }}{{ eos_token }}"
          "{% endgeneration %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
TEXTS = ["hello world", "héllo wörld 你好! the fox", "  two leading spaces", "don't . stop ,", "<|im_end|> in text", ""]
MESSAGES = [[{"role": "user", "content": "hello fox"}],
            [{"role": "user", "content": "the quick"}, {"role": "assistant", "content": "brown fox"},
             {"role": "user", "content": " jumps "}]]


def sentencepiece(path: Path) -> Path:
    sp = tokenizers.SentencePieceBPETokenizer(unk_token="<unk>", add_prefix_space=True)
    sp.train_from_iterator(CORPUS, vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=100)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=sp._tokenizer, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", add_bos_token=True)
    fast.chat_template = LLAMA2
    fast.save_pretrained(path)
    return path


def ours(path: Path) -> Tokenizer:
    return Tokenizer({n: (path / n).read_bytes() for n in FILES if (path / n).is_file()}, str(path))


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def saved(request, tmp_path_factory) -> Path:
    return {"byte_level": byte_level, "sentencepiece": sentencepiece}[request.param](tmp_path_factory.mktemp(request.param))


def test_encode_decode_and_the_chat_template_equal_hugging_faces(saved):
    hf, tok = transformers.AutoTokenizer.from_pretrained(saved), ours(saved)
    for text in TEXTS:
        assert tok.encode(text) == hf(text)["input_ids"], text
        ids = tok.encode(text)
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
    for messages in MESSAGES:
        want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        assert tok.chat(messages) == want
        assert tok.render(messages, add_generation_prompt=False) == hf.apply_chat_template(messages, tokenize=False)
    assert tok.vocab_size == len(hf)
    past = tok.vocab_size + 3  # a model's logits padded past its tokenizer: an id the tokenizer has no text for
    assert tok.decode([past]) == hf.decode([past], skip_special_tokens=True) == "" and tok.token_bytes(past) == b""


def test_streamed_text_equals_the_decoded_text_and_holds_split_characters(saved):
    tok = ours(saved)
    ids = tok.encode("héllo wörld 你好! the quick brown fox")
    stream = tok.stream()
    pieces = [stream.add(t) for t in ids] + [stream.flush()]
    assert "".join(pieces) == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
    if "▁" not in json.loads((saved / "tokenizer.json").read_text())["model"]["vocab"]:  # byte-level: 你 is 3 bytes
        assert any(p == "" for p in pieces[:-1])  # held back until its last byte came


def test_truncation_and_padding_saved_in_tokenizer_json_do_not_cut_a_text(tmp_path):
    """sentence-transformers save their tokenizer.json with truncation (and padding) on: as transformers' tokenizer
    does for a call that does not ask for them, every token of a text is kept, none added."""
    path = byte_level(tmp_path / "bl")
    spec = json.loads((path / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    spec["padding"] = {"strategy": {"Fixed": 32}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                       "pad_type_id": 0, "pad_token": "<|endoftext|>"}
    (path / "tokenizer.json").write_text(json.dumps(spec))
    hf, tok = transformers.AutoTokenizer.from_pretrained(path), ours(path)
    text = "the quick brown fox jumps over the lazy dog"
    assert tok.encode(text) == hf(text)["input_ids"] and len(tok.encode(text)) > 4 and 0 not in tok.encode(text)


def test_what_a_template_or_a_message_refuses_is_one_line(tmp_path):
    tok = ours(sentencepiece(tmp_path / "sp"))
    with pytest.raises(CallError, match="the chat template refused the messages: System role not supported"):
        tok.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    with pytest.raises(CallError, match="every message needs a role"):
        tok.chat([{"content": "hi"}])
    with pytest.raises(CallError, match="messages must be a non-empty list"):
        tok.chat([])
    with pytest.raises(CallError, match="a chat message or template argument holds object"):
        tok.chat([{"role": "user", "content": object()}])
    (tmp_path / "sp" / "chat_template.jinja").unlink()
    with pytest.raises(CallError, match="has no chat template"):
        ours(tmp_path / "sp").chat(MESSAGES[0])
    with pytest.raises(CallError, match="the tokenizer is not readable"):
        Tokenizer({"tokenizer.json": b"{not json"}, "broken")


THINKING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
            "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")  # Qwen3's switch


def test_template_arguments_reach_the_template_as_apply_chat_templates_do(tmp_path):
    """Qwen3's ``enable_thinking=False`` (vLLM's ``chat_template_kwargs``): the template reads it as it reads
    ``apply_chat_template``'s keyword arguments; the call's own variables cannot be replaced."""
    path = byte_level(tmp_path / "bl")
    (path / "chat_template.jinja").write_text(THINKING)
    hf, tok = transformers.AutoTokenizer.from_pretrained(path), ours(path)
    for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
        want = hf.apply_chat_template(MESSAGES[0], add_generation_prompt=True, tokenize=True, **kwargs)["input_ids"]
        assert tok.chat(MESSAGES[0], **kwargs) == want, kwargs
    assert tok.chat(MESSAGES[0], enable_thinking=False) != tok.chat(MESSAGES[0])
    with pytest.raises(CallError, match="the chat template's variable 'messages' is set by the call itself"):
        tok.render(MESSAGES[0], messages=[])


def test_the_sandbox_keeps_a_template_from_python(tmp_path):
    """A chat template is the checkpoint author's code: it renders in jinja2's immutable sandbox."""
    path = byte_level(tmp_path / "bl")
    (path / "chat_template.jinja").write_text("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(CallError, match="the chat template refused the messages"):
        ours(path).chat(MESSAGES[0])
    (path / "chat_template.jinja").write_text("{% set x = messages.append(1) %}{{ messages | length }}")
    with pytest.raises(CallError, match="the chat template refused the messages"):
        ours(path).chat(MESSAGES[0])


def test_a_pairs_ids_and_token_types_equal_hugging_faces(tmp_path):
    """``spans(text, pair)``: the ids ``tokenizer(text, pair)`` gives, and its ``token_type_ids`` where the
    tokenizer's ``model_input_names`` hold them (BERT's: the pair's second text 1), else zeros, as the model gets
    them when transformers leaves them out (RoBERTa's, a generic tokenizer.json's)."""
    from examples.classifier_checkpoint import checkpoint

    path = checkpoint(tmp_path / "wp")
    for typed in (False, True):
        if typed:
            config = json.loads((path / "tokenizer_config.json").read_text())
            config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
            (path / "tokenizer_config.json").write_text(json.dumps(config))
        hf, tok = transformers.AutoTokenizer.from_pretrained(path), ours(path)
        for text, pair in (("where is the fox", "the quick brown fox"), ("héllo", "wörld, don't")):
            want, got = hf(text, pair), tok.spans(text, pair)
            assert got.ids == want["input_ids"] and tok.gives_types == typed
            assert got.type_ids == want.get("token_type_ids", [0] * len(got.ids)) and (1 in got.type_ids) == typed


def test_a_tokenizer_that_names_no_class_is_read_as_the_model_types_as_autotokenizer_reads_it(tmp_path):
    """bert-base-uncased's tokenizer_config.json (and older fine-tunes') names no tokenizer class: AutoTokenizer
    loads the model type's (``BertTokenizer``), whose pairs give the second text token type 1. The build stores
    that class (``builder/tokenizer.files``), so a cross-encoder's pairs reach it as transformers gives them,
    never as one text; with no tokenizer_config.json at all alike. A class the file names is kept."""
    from examples.classifier_checkpoint import checkpoint
    from tripy_build.builder import tokenizer as stored_tokenizer

    path = checkpoint(tmp_path / "wp")
    named = json.loads((path / "tokenizer_config.json").read_text())
    config = {k: v for k, v in named.items() if k != "tokenizer_class"}
    for written in (config, None):
        if written is None:
            (path / "tokenizer_config.json").unlink()
        else:
            (path / "tokenizer_config.json").write_text(json.dumps(written))
        hf = transformers.AutoTokenizer.from_pretrained(path)
        stored = stored_tokenizer.files(str(path))
        assert json.loads(stored["tokenizer_config.json"])["tokenizer_class"] == "BertTokenizer"
        tok = Tokenizer(stored, "x")
        want, got = hf("where is the fox", "the quick brown fox"), tok.spans("where is the fox", "the quick brown fox")
        assert got.ids == want["input_ids"] and got.type_ids == want["token_type_ids"] and 1 in got.type_ids
    (path / "tokenizer_config.json").write_text(json.dumps(named))  # its own class (generic): no token types
    stored = stored_tokenizer.files(str(path))
    assert stored["tokenizer_config.json"] == (path / "tokenizer_config.json").read_bytes()
    assert not Tokenizer(stored, "x").gives_types
    assert "token_type_ids" not in transformers.AutoTokenizer.from_pretrained(path)("a", "b")
