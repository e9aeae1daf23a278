"""A tiny chat model as a Hugging Face checkpoint: a ``Qwen2ForCausalLM`` of random weights with a byte-level BPE
tokenizer and a ChatML chat template with tool calls (Qwen2.5-Instruct's format), saved with ``save_pretrained``::

    python examples/chat_checkpoint.py my-chat
    python -m tripy_build model=hf task=generate params.checkpoint=my-chat

Its words are noise (random weights); a real checkpoint (a downloaded Qwen2.5-0.5B-Instruct) builds the same way.
Needs transformers and torch (``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import sys
from pathlib import Path

CORPUS = ["hello world, the quick brown fox jumps over the lazy dog. héllo wörld! 你好 don't"] * 20
# ChatML with tool calls written as Qwen2.5's and Qwen3's templates write them (<tool_call> JSON lines, runtime/tools.py's
# "hermes"; its list of tools is short, names only, so that a tiny test cache holds it), and a thinking switch: with
# enable_thinking the generation prompt opens a <think> block, as DeepSeek-R1's does, and a past reply's thinking is
# left out, as Qwen3's and R1's templates leave it (runtime/reasoning.py)
CHATML = ("{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
          "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
          "{% if m['content'] %}{{ m['content'].split('</think>')[-1] }}{% endif %}"
          "{% for c in m['tool_calls'] or [] %}<tool_call>\n"
          '{"name": "{{ c[\'function\'][\'name\'] }}", "arguments": {{ c[\'function\'][\'arguments\'] | tojson }}}\n'
          "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
          "{% if enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}")


def tokenizer(path: str | Path, tool_tokens: bool = True) -> Path:
    """A byte-level BPE tokenizer (as GPT-2's, Llama 3's and Qwen's) with ChatML's special tokens, Qwen's tool-call
    tags as tokens of their own (unless not ``tool_tokens``) and the template."""
    import tokenizers
    import transformers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    # as in Qwen's vocabulary: the tool-call tags are tokens of their own that are not special (a decoded reply keeps them)
    if tool_tokens:
        tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in ("<tool_call>", "</tool_call>")])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(path)
    return Path(path)


def checkpoint(path: str | Path, seed: int = 0) -> Path:
    """The tokenizer and a 2-layer Qwen2 over its vocabulary, its end id the template's ``<|im_end|>``."""
    import torch
    import transformers

    tokenizer(path)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    transformers.Qwen2ForCausalLM(config).eval().save_pretrained(path)
    return Path(path)


if __name__ == "__main__":
    print(checkpoint(sys.argv[1] if len(sys.argv) > 1 else "my-chat"))
