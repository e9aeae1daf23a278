"""``python -m tripy_build inspect PATH [--dump DIR]``: what an artifact holds, as readable tables.

Inputs and their ranges, each dim's strategy, every profile (its shapes, size, compile time, and with
``--cost`` XLA's FLOP and memory estimates), the weights, the files, the toolchain and compiler
options, the build-key parts and, for a reduced-precision build, the error measured against float32.
Nothing is compiled. ``--dump DIR`` also writes the generated code to files (Mithril's
generated-code-to-file): ``program.mlir`` (the portable StableHLO), ``prep.mlir``, and per profile
``profile_<sizes>.hlo`` (XLA's optimized HLO) with ``cost.json`` (FLOPs, bytes accessed, memory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..artifact.describe import manifest_text
from ..artifact.read import read_index, read_manifest
from ..errors import exit_status


def _costs(path: Path) -> dict[str, Any]:
    """Per profile file: XLA's cost and memory analysis of the deserialized executable."""
    from ..runtime.loader import load

    exe = load(path, warmup="none")
    out = {}
    for i, pre in enumerate(exe.compiled.profiles):
        if not pre.entry.is_xla:  # IREE's modules have no cost analysis
            continue
        compiled = pre.ready()
        cost = compiled.cost_analysis() or {}
        mem = compiled.memory_analysis()
        out[f"executables/{i}.xla"] = {
            "flops": cost.get("flops"), "transcendentals": cost.get("transcendentals"),
            "bytes_accessed": cost.get("bytes accessed"),
            "argument_bytes": getattr(mem, "argument_size_in_bytes", None),
            "output_bytes": getattr(mem, "output_size_in_bytes", None),
            "temp_bytes": getattr(mem, "temp_size_in_bytes", None),
        }
    return out


def describe(path: str | os.PathLike, costs: dict[str, Any] | None = None) -> str:
    """The artifact at ``path`` as tables (``artifact.describe.manifest_text``)."""
    root = Path(path)
    m = read_manifest(root)
    return manifest_text(root, m, read_index(root, m), read_index(root, m, "compile_seconds"), costs)


def dump(path: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """Write the StableHLO of the programs and, per profile, the optimized HLO and the cost analysis."""
    from ..runtime.loader import load

    exe = load(path, warmup="none")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "program.mlir"]
    program = exe.compiled.program
    written[0].write_text(program.main.mlir_module())
    if program.prep is not None:
        (out / "prep.mlir").write_text(program.prep.mlir_module())
        written.append(out / "prep.mlir")
    for pre in exe.compiled.profiles:
        if not pre.entry.is_xla:  # an IREE module: its input is program.mlir
            continue
        name = "_".join(f"{k}{v}" for k, v in pre.entry.profile.items()) or "static"
        target = out / f"profile_{name}.hlo"
        target.write_text(pre.ready().as_text())
        written.append(target)
    costs = out / "cost.json"
    costs.write_text(json.dumps(_costs(Path(path)), indent=1, sort_keys=True))
    return [*written, costs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tripy-build inspect", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="an artifact directory")
    parser.add_argument("--cost", action="store_true", help="add XLA's FLOP and memory estimates per profile")
    parser.add_argument("--dump", metavar="DIR", help="write the StableHLO, per-profile optimized HLO and costs")
    args = parser.parse_args(argv)

    def run() -> None:
        print(describe(args.path, _costs(Path(args.path)) if args.cost or args.dump else None))
        if args.dump:
            files = dump(args.path, args.dump)
            print(f"\nwrote {len(files)} files to {args.dump}: {', '.join(f.name for f in files[:6])}"
                  + (" ..." if len(files) > 6 else ""))
    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
