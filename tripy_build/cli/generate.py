"""``tripy-build generate PATH --input-ids 464,2068,318 --max-new-tokens 20``: new tokens from an artifact
built with ``task=generate``, through the jax-free runtime (``runtime.load(PATH).generate``).

Prints the new token ids of each prompt on a line (``--json``: ``{"output_ids": [...]}``, or a list of
them for several prompts). ``--input-ids`` given several times runs a batch of prompts of any lengths.
``--prompt TEXT`` (or ``--chat TEXT``: a user's message in the checkpoint's chat template, after ``--system
TEXT`` if given) takes text through the tokenizer the artifact stores and prints each new text (``--json``:
``{"text_output": ..., "output_ids": [...]}``). ``--audio FILE.wav`` (a speech model's: Whisper's) prints the text of
each WAV file (``runtime.load(PATH).transcribe``: of any length, over 30 s in windows), in ``--language`` and for
``--task`` where given, after ``--initial-prompt TEXT`` where given; with ``--timestamps``, each segment on a line
after its times (``[0.00 --> 4.20] text``; ``--json``: ``{"text": ..., "segments": [{"start", "end", "text"}, ...]}``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import CallError, exit_status


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token ids (e.g. 464,2068,318)") from None
    if not ids:
        raise argparse.ArgumentTypeError("an empty prompt; give at least one token id")
    return ids


def _schema(text: str) -> dict:
    try:
        schema = json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a JSON schema (JSON text, or @FILE): {e}") from None
    if not isinstance(schema, dict):
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: a JSON schema is an object, such as {{\"type\": \"object\"}}")
    return schema


def _early(text: str) -> bool | str:
    choices = {"true": True, "false": False, "never": "never"}
    if text.lower() not in choices:
        raise argparse.ArgumentTypeError(f"{text!r}: give true, false or never")
    return choices[text.lower()]


def _stops(text: str) -> list[int]:
    return [] if text.strip().lower() == "none" else _ids(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tripy-build generate", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="an artifact built with task=generate")
    prompts = parser.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--input-ids", type=_ids, action="append", metavar="IDS",
                         help="a prompt's token ids, comma-separated; repeat for a batch of prompts")
    prompts.add_argument("--prompt", action="append", metavar="TEXT",
                         help="a prompt as text, through the checkpoint's tokenizer; repeat for a batch")
    prompts.add_argument("--audio", action="append", metavar="FILE.wav",
                         help="a speech model's (Whisper's): transcribe this WAV file (16 kHz; repeat for a batch)")
    prompts.add_argument("--chat", action="append", metavar="TEXT",
                         help="a user's message, in the checkpoint's chat template; repeat for a batch")
    parser.add_argument("--system", metavar="TEXT", help="with --chat: a system message before each user message")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="tokens to generate per prompt (default 20; with --audio, all the decoder's positions)")
    parser.add_argument("--language", help="with --audio: the language spoken, a code such as fr (default: detected)")
    parser.add_argument("--task", choices=("transcribe", "translate"),
                        help="with --audio: transcribe (the default), or translate to English")
    parser.add_argument("--timestamps", action="store_true",
                        help="with --audio: print each segment of speech with its start and end, in seconds")
    parser.add_argument("--initial-prompt", metavar="TEXT",
                        help="with --audio: a text read before each reply (names and terms the audio holds)")
    # the sampling options; left out: the artifact's defaults (its checkpoint's generation_config.json's, else greedy)
    parser.add_argument("--temperature", type=float, help="0: greedy; above 0: sampling")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens (0: every token)")
    parser.add_argument("--top-p", type=float,
                        help="then among the fewest most likely tokens whose probabilities add up to p (1: every token)")
    parser.add_argument("--min-p", type=float,
                        help="then among the tokens at least this fraction as likely as the most likely (0: every token)")
    parser.add_argument("--repetition-penalty", type=float,
                        help="divide the logits of tokens already in the prompt or the reply by this (1: none)")
    parser.add_argument("--frequency-penalty", type=float,
                        help="subtract this from a token's logit per time the reply holds it (0: none)")
    parser.add_argument("--presence-penalty", type=float,
                        help="subtract this from the logit of each token the reply holds (0: none)")
    parser.add_argument("--seed", type=int, default=None, help="the sampling's seed (the same seed, the same tokens)")
    parser.add_argument("--eos-token-id", type=_stops, default=None, metavar="IDS",
                        help="a prompt stops after generating one of these ids, comma-separated (default: the "
                             "artifact's generate.eos_token_id, from its checkpoint); none: run to --max-new-tokens")
    parser.add_argument("--json-schema", type=_schema, metavar="SCHEMA",
                        help='hold each reply to this JSON schema (JSON text, or @FILE); {"type": "object"}: any object')
    # beam search; left out: the artifact's (its checkpoint's), for replies picked by score
    parser.add_argument("--num-beams", type=int, help="each reply: the best of this many beams (1: none)")
    parser.add_argument("--length-penalty", type=float,
                        help="with beams: a reply's score is its log probability over its length to this power")
    parser.add_argument("--early-stopping", type=_early, metavar="{true,false,never}",
                        help="with beams: true: stop at num_beams ended replies; false: when none could be beaten; "
                             "never: at the longest length")
    parser.add_argument("--json", action="store_true", help='print {"output_ids": [...]} (new tokens only)')
    args = parser.parse_args(argv)

    def run() -> None:
        from ..runtime.generate import before_stop
        from ..runtime.runtime import load
        from ..runtime.sampling import NAMES

        if args.max_new_tokens is not None and args.max_new_tokens < 1:
            raise CallError(f"--max-new-tokens {args.max_new_tokens}: must be at least 1.")
        if args.system is not None and args.chat is None:
            raise CallError("--system is the system message of a --chat; give --chat TEXT too.")
        if (args.language or args.task or args.timestamps or args.initial_prompt) and not args.audio:
            raise CallError("--language, --task, --timestamps and --initial-prompt are a speech model's; give --audio "
                            "FILE.wav too.")
        rt = load(args.path, warmup="none")
        if args.audio:
            return _transcribe(rt, args)
        args.max_new_tokens = args.max_new_tokens or 20
        tok = rt.tokenizer if args.input_ids is None else None
        system = [] if args.system is None else [{"role": "system", "content": args.system}]
        prompts = (args.input_ids if tok is None else [tok.encode(t) for t in args.prompt] if args.prompt else
                   [tok.chat([*system, {"role": "user", "content": t}]) for t in args.chat])
        out = rt.generate(prompts, args.max_new_tokens, seed=args.seed, eos_token_id=args.eos_token_id,
                          json_schema=args.json_schema, num_beams=args.num_beams, length_penalty=args.length_penalty,
                          early_stopping=args.early_stopping, **{k: getattr(args, k) for k in NAMES})
        rows = [[int(t) for t in row] for row in out]
        if tok is None:
            answers = [{"output_ids": r} for r in rows]
        else:
            stops = rt.generation_steps().spec().stops(args.eos_token_id)
            answers = [{"text_output": tok.decode(kept), "output_ids": kept}
                       for kept in (before_stop(r, stops) for r in rows)]
        if args.json:
            print(json.dumps(answers[0] if len(answers) == 1 else answers, ensure_ascii=False))
        else:
            for a in answers:
                print(a["text_output"] if tok is not None else ",".join(map(str, a["output_ids"])))
    return exit_status(run)


def _transcribe(rt, args: argparse.Namespace) -> None:
    """``--audio``: each WAV file's text (``--json``: ``{"text": ...}`` each)."""
    from ..runtime.audio import LogMel, wav
    from ..runtime.generate import Spec

    heard = LogMel(**Spec.from_metadata(rt.metadata, "generate").audio)
    waves = []
    for name in args.audio:
        try:
            data = Path(name).read_bytes()
        except OSError as e:
            raise CallError(f"--audio {name}: {e.strerror or e}.") from None
        try:
            waves.append(wav(data, heard.sampling_rate, filename=Path(name).name))
        except CallError as e:
            raise CallError(f"--audio {name}: {e}") from None
    answers = rt.transcribe(waves, sampling_rate=heard.sampling_rate, language=args.language, task=args.task,
                            max_new_tokens=args.max_new_tokens, num_beams=args.num_beams,
                            temperature=args.temperature, seed=args.seed, return_timestamps=args.timestamps,
                            prompt=args.initial_prompt)
    for answer in answers:
        if args.json:
            print(json.dumps(answer if args.timestamps else {"text": answer}, ensure_ascii=False))
        elif args.timestamps:
            print("\n".join(f"[{s['start']:.2f} --> {s['end']:.2f}]{s['text']}" for s in answer["segments"]))
        else:
            print(answer)


if __name__ == "__main__":
    sys.exit(main())
