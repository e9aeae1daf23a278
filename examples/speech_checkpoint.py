"""A speech recognizer as a Hugging Face checkpoint: a ``WhisperForConditionalGeneration`` of random weights with
Whisper's kind of tokenizer (byte-level BPE, then ``<|endoftext|>``, ``<|startoftranscript|>``, language tokens,
``<|translate|>``, ``<|transcribe|>``, ``<|startofprev|>``, ``<|nospeech|>``, ``<|notimestamps|>`` and the
timestamps ``<|0.00|>`` to ``<|30.00|>``), openai/whisper-tiny's kind of generation config (the language detected,
then ``<|transcribe|>``; suppressed tokens; the first timestamp within a second) and feature extractor, saved with
``save_pretrained``, and a WAV file to try it on (``sample.wav``: two seconds of a tone at 16 kHz)::

    python examples/speech_checkpoint.py my-whisper            # tiny: 2 + 2 layers of 32
    python -m tripy_build model=whisper task=generate params.checkpoint=my-whisper
    tripy-build generate $(tripy-build list --latest model=whisper) --audio my-whisper/sample.wav

Its transcripts are noise (random weights, a tiny vocabulary); openai/whisper-* build the same way. Needs
transformers and torch (``pip install -e '.[hf]'``).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: its folder is on the path, the repository is not
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.chat_checkpoint import CORPUS

LANGUAGES = ("en", "fr", "de", "es")
TIMESTAMPS = 1501  # <|0.00|> to <|30.00|>, after <|notimestamps|>, as in Whisper's vocabulary
TINY = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=1500, max_target_positions=48)


def tokenizer(path: str | Path):
    """Whisper's kind of tokenizer trained on a small corpus, saved in ``path``; returns it."""
    import tokenizers
    import transformers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    specials = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{c}|>" for c in LANGUAGES), "<|translate|>",
                "<|transcribe|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>",
                *(f"<|{i * 0.02:.2f}|>" for i in range(TIMESTAMPS))]
    tok.add_special_tokens(specials)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                                eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(path)
    return fast


def checkpoint(path: str | Path, sizes: dict | None = None, init_std: float = 0.5):
    """The tokenizer, the feature extractor and the model (``sizes``: ``WhisperConfig`` settings, ``TINY`` by default)
    saved in ``path``; returns the PyTorch model and the tokenizer."""
    import torch
    import transformers

    fast = tokenizer(path)
    ids = fast.convert_tokens_to_ids
    eos, start = ids("<|endoftext|>"), ids("<|startoftranscript|>")
    torch.manual_seed(0)
    config = transformers.WhisperConfig(vocab_size=len(fast), **(sizes or TINY), init_std=init_std,
                                        decoder_start_token_id=start, pad_token_id=eos, bos_token_id=eos,
                                        eos_token_id=eos, begin_suppress_tokens=[ids("Ġ"), eos])
    model = transformers.WhisperForConditionalGeneration(config).eval()
    settings = dict(forced_decoder_ids=[[1, None], [2, ids("<|transcribe|>")]], is_multilingual=True,
                    lang_to_id={f"<|{c}|>": ids(f"<|{c}|>") for c in LANGUAGES},
                    task_to_id={"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")},
                    no_timestamps_token_id=ids("<|notimestamps|>"), suppress_tokens=[ids("!"), ids('"'), ids("#")],
                    begin_suppress_tokens=[ids("Ġ"), eos], return_timestamps=False, max_initial_timestamp_index=50,
                    prev_sot_token_id=ids("<|startofprev|>"))
    for key, value in settings.items():  # Whisper's keys are not GenerationConfig's own: update() would drop them
        setattr(model.generation_config, key, value)
    model.generation_config._from_model_config = False  # else from_pretrained drops the keys above, as the Hub's are kept
    model.save_pretrained(path)
    transformers.WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(path)
    sample(Path(path) / "sample.wav")
    return model, fast


def sample(path: Path, seconds: float = 2.0, rate: int = 16000) -> Path:
    """A WAV file of 16-bit PCM: a 440 Hz tone with a little noise."""
    import wave

    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.01 * np.random.default_rng(0).standard_normal(t.size)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((x * 32767).astype("<i2").tobytes())
    return path


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "my-whisper"
    checkpoint(out)
    print(out)
