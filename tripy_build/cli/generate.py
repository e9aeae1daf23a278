"""``tripy-build generate PATH --input-ids 464,2068,318 --max-new-tokens 20``: new tokens from an artifact
built with ``task=generate``, through the jax-free runtime (``runtime.load(PATH).generate``).

Prints the new token ids of each prompt on a line (``--json``: ``{"output_ids": [...]}``, or a list of
them for several prompts). ``--input-ids`` given several times runs a batch of prompts of any lengths.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import CallError, exit_status


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token ids (e.g. 464,2068,318)") from None
    if not ids:
        raise argparse.ArgumentTypeError("an empty prompt; give at least one token id")
    return ids


def _stops(text: str) -> list[int]:
    return [] if text.strip().lower() == "none" else _ids(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tripy-build generate", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="an artifact built with task=generate")
    parser.add_argument("--input-ids", type=_ids, action="append", required=True, metavar="IDS",
                        help="a prompt's token ids, comma-separated; repeat for a batch of prompts")
    parser.add_argument("--max-new-tokens", type=int, default=20, help="tokens to generate per prompt (default 20)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); above 0: sampling")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    parser.add_argument("--seed", type=int, default=None, help="the sampling's seed (the same seed, the same tokens)")
    parser.add_argument("--eos-token-id", type=_stops, default=None, metavar="IDS",
                        help="a prompt stops after generating one of these ids, comma-separated (default: the "
                             "artifact's generate.eos_token_id, from its checkpoint); none: run to --max-new-tokens")
    parser.add_argument("--json", action="store_true", help='print {"output_ids": [...]} (new tokens only)')
    args = parser.parse_args(argv)

    def run() -> None:
        from ..runtime.runtime import load

        if args.max_new_tokens < 1:
            raise CallError(f"--max-new-tokens {args.max_new_tokens}: must be at least 1.")
        rt = load(args.path, warmup="none")
        out = rt.generate(args.input_ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                          seed=args.seed, eos_token_id=args.eos_token_id)
        rows = [[int(t) for t in row] for row in out]
        if args.json:
            print(json.dumps({"output_ids": rows[0]} if len(rows) == 1 else [{"output_ids": r} for r in rows]))
        else:
            for row in rows:
                print(",".join(map(str, row)))
    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
