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

from .. import host
from ..artifact import layout as artifact
from ..errors import exit_status
from ..core.profiles import first_use_compiles


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    line = lambda r: "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [line(headers), line(["-" * w for w in widths]), *map(line, cells)]


def _costs(path: Path) -> dict[str, Any]:
    """Per profile file: XLA's cost and memory analysis of the deserialized executable."""
    from ..artifact.serialization import load

    exe = load(path, warmup="none")
    out = {}
    for i, pre in enumerate(exe._precompiled):
        if pre.meta.get("format") != host.FORMAT:  # IREE's modules have no cost analysis
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
    root = Path(path)
    m = artifact.read_manifest(root)
    index = artifact.read_index(root, m)
    seconds = artifact.read_index(root, m, "compile_seconds")
    meta = m.get("metadata") or {}
    out = [f"artifact: {root}", f"  function {m.get('function')!r}, format v{m['schema_version']}, "
           f"optimization_level {m.get('optimization_level')}, platforms {', '.join(m.get('platforms', []))}"]
    out += ["", "inputs"] + _table(["input", "spec"], [[s["path"], artifact.spec_text(s)] for s in m.get("input_specs", [])])
    if m.get("sizes"):
        passed = ", ".join(f"{s['path']} = the true size of {s['dim']!r}" for s in m["sizes"])
        out += [f"  passed to the function, not part of the signature: {passed}"]
    out += ["", "outputs"] + _table(["output", "spec"], [[i, artifact.spec_text(o)] for i, o in enumerate(m.get("outputs", []))])
    if m.get("dims"):
        out += ["", "dims"] + _table(["dim", "range", "opt", "strategy", "padding", "buckets", "compiled on first use"], [
            [d["name"] or d["symbol"], f"[{d['min']}..{d['max']}]", d["opt"], d["strategy"], d["padding"] or "-",
             " ".join(map(str, d["buckets"])) or "-", first_use_compiles(d) or "none"] for d in m["dims"]])
    rows = []
    for e in m.get("executables", []):
        c = (costs or {}).get(e["file"], {})
        label = "every shape" if e.get("dynamic") else " ".join(f"{k}={v}" for k, v in (e.get("profile") or {}).items())
        rows.append([label or "static", e["file"],
                     artifact.human_size(index.get(e["file"], {}).get("size", 0)), f"{seconds.get(e['file'], 0):.2f}",
                     f"{c['flops'] / 1e6:.1f}" if c.get("flops") is not None else "-",
                     artifact.human_size(c["temp_bytes"]) if c.get("temp_bytes") is not None else "-"])
    compiler = m.get("compiler") or {"name": "xla"}
    out += ["", f"compiler: {compiler['name']}" + (f", {compiler['mode']}" if compiler.get("mode") else "")
            + (" (weights stored twice: packed in the module, and as weights/)" if compiler.get("mode") == "dynamic" else "")
            + (f" (the dynamic program was refused: {compiler['why']})" if compiler.get("why") else "")
            + (f", flags {' '.join(compiler['flags'])}" if compiler.get("flags") else "")]
    out += ["", f"profiles ({len(rows)})"] + _table(["profile", "file", "size", "compile s", "MFLOP", "temp"], rows)
    if m.get("weights"):
        out += ["", "weights"] + _table(["weight", "argument", "dtype", "shape", "file"], [
            [w["path"], w["argument"] or "-", w["dtype"], tuple(w["shape"]), w["file"]] for w in m["weights"]])
        out.append(f"  prep program: {'yes (' + m['prep']['file'] + ')' if m.get('prep') else 'none (weights used as stored)'}")
    files: dict[str, int] = {}
    for rel, entry in {**m.get("files", {}), **index}.items():
        top = rel.split("/", 1)[0] + ("/" if "/" in rel else "")
        files[top] = files.get(top, 0) + entry["size"]
    out += ["", f"files ({artifact.human_size(sum(files.values()))})"] + _table(["file", "size"], [[k, artifact.human_size(v)] for k, v in sorted(files.items())])
    out += ["", "toolchain"] + _table(["what", "value"], [[k, v] for k, v in sorted(m.get("toolchain", {}).items())])
    out += ["  compiler options: " + json.dumps(m.get("compiler_options", {}), sort_keys=True)]
    if meta.get("precision"):
        p = meta["precision"]
        out += ["", f"precision {p['dtype']}: max abs error {p['max_abs_error']:.3g}, max rel error "
                f"{p['max_rel_error']:.3g} against float32 on the self-test inputs"
                + (f" (budget {p['max_error']:g})" if p.get("max_error") is not None else "")]
    if meta.get("build_key_parts"):
        parts = meta["build_key_parts"]
        out += ["", f"build key {meta.get('build_key', '')[:16]}"] + _table(["part", "value"], [
            [k, json.dumps(v, sort_keys=True)[:100]] for k, v in sorted(parts.items())])
    return "\n".join(out)


def dump(path: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """Write the StableHLO of the programs and, per profile, the optimized HLO and the cost analysis."""
    from ..artifact.serialization import load

    exe = load(path, warmup="none")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "program.mlir"]
    written[0].write_text(exe._program.main.mlir_module())
    if exe._program.prep is not None:
        (out / "prep.mlir").write_text(exe._program.prep.mlir_module())
        written.append(out / "prep.mlir")
    for pre in exe._precompiled:
        if pre.meta.get("format") != host.FORMAT:  # an IREE module: its input is program.mlir
            continue
        name = "_".join(f"{k}{v}" for k, v in (pre.meta.get("profile") or {}).items()) or "static"
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
