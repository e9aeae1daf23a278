"""An artifact in words for people: sizes, tensor specs, tables, the manifest as ``inspect`` shows it and
the one line ``list`` gives it. Every command prints through these, so they agree."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from ..core.profiles import first_use_compiles
from ..core.signature import declared
from ..core.spec import InputInfo, output_names
from ..errors import TripyBuildError
from .layout import disk_size
from .manifest import RECORDED_CONFIG_DEFAULTS, Manifest


def human_size(n: float) -> str:
    """``9.0 MB``: a byte count as every command shows it, in units of 1024 (as ``gc --max-bytes 2G`` reads it)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def spec_text(info: InputInfo) -> str:
    """``float32[batch=[1..64, opt 8], 512]``: a tensor spec in one line, as a call's errors write it."""
    return declared(info)


def table(headers: Sequence[str] | None, rows: Sequence[Sequence[Any]], indent: str = "  ") -> list[str]:
    """Rows as aligned columns, under ``headers`` and a rule (no headers: the rows alone)."""
    cells = [[str(c) for c in r] for r in rows]
    width_of = [list(headers)] if headers else []
    widths = [max(len(r[i]) for r in [*width_of, *cells]) for i in range(len((width_of or cells or [[]])[0]))]
    line = lambda r: indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    head = [line(list(headers)), line(["-" * w for w in widths])] if headers else []
    return [*head, *map(line, cells)]


def dim_lines(m: Manifest, generation: bool = False) -> list[str]:
    """One line per dynamic dim: its range, how it is served, and which sizes compile on first use; for an entry
    of a ``task=generate`` artifact (``generation``), which its driver calls in bucket-sized chunks only
    (``runtime/generate``), that it needs no other."""
    strategies = {"padded": "padded ({})", "buckets": "not padded", "compile": "not padded, opt only",
                  "dynamic": "dynamic"}
    lines = []
    for d in m.dims:
        strategy = m.strategy(d)
        lines.append(f"{d.name or d.symbol} [{d.bounds[0]}..{d.bounds[2]}]: {strategies[strategy].format(d.padding)}"
                     + (f", buckets {' '.join(map(str, d.buckets))}" if d.buckets and strategy != "dynamic" else "")
                     + ("" if not (gap := first_use_compiles(d, strategy)) else
                        "; generation runs these sizes only" if generation else f"; {gap} compile on first use"))
    return lines


def file_sizes(m: Manifest, index: dict[str, Any]) -> dict[str, int]:
    """Bytes per top-level file or folder of the artifact (``weights/``, ``program.jaxexport``...)."""
    sizes: dict[str, int] = {}
    entries = {**{rel: e.size for rel, e in m.files.items()}, **{rel: e["size"] for rel, e in index.items()}}
    for rel, size in entries.items():
        top = rel.split("/", 1)[0] + ("/" if "/" in rel else "")
        sizes[top] = sizes.get(top, 0) + size
    return sizes


def compiler_line(m: Manifest) -> str:
    """Which compiler made the executables and how: ``by IREE (dynamic); the weights are stored twice...``."""
    c = m.compiler
    by = f"by {c.name.upper()}" + (f" ({c.mode})" if c.mode else "")
    if c.why:
        by += f", as it cannot compile the dynamic program ({c.why})"
    if c.mode == "dynamic":
        by += ("; the weights are stored twice: packed into the module as constants (IREE repacks weights passed "
               "as arguments on every call, 2.5-5x slower) and as weights/ (verify, rebuilds, checkpoints)")
    return by


def profiles_line(m: Manifest, index: dict[str, Any], seconds: dict[str, float]) -> str:
    """``7 precompiled by XLA, 150.5 KB, 0.5 s of compile time`` (``7 for each of cpu, cuda (NVIDIA H100 80GB
    HBM3)`` with several platforms), or ``""`` with none."""
    if not m.executables:
        return ""
    size = sum(index.get(e.file, {}).get("size", 0) for e in m.executables)
    count = str(len(m.executables))
    platforms = list(dict.fromkeys(e.platform for e in m.executables))
    if platforms != ["cpu"]:
        count = f"{len(m.executables) // len(platforms)} for {'each of ' if len(platforms) > 1 else ''}" + ", ".join(
            platform_text(m, p) for p in platforms) + ","
    return (f"{count} precompiled {compiler_line(m)}, {human_size(size)}, "
            f"{sum(seconds.get(e.file, 0) for e in m.executables):.1f} s of compile time")


def platform_text(m: Manifest, platform: str) -> str:
    """``cuda (NVIDIA H100 80GB HBM3, sm_90a, compiled without it)``: a platform, and the GPU its executables are for."""
    deps = next((e.depends_on for e in m.executables if e.platform == platform), {})
    if not deps.get("gpu"):
        return platform
    return (f"{platform} ({deps['gpu']}, {deps.get('code') or 'compute capability ' + str(deps.get('compute_capability'))}"
            + (", compiled without it" if deps.get("deviceless") else "") + ")")


def gpu_lines(m: Manifest) -> list[str]:
    """What a build for a GPU that was not there left undone (``gpu.NOT_DONE``, as its executables record it)."""
    deps = next((e.depends_on for e in m.executables if e.depends_on.get("deviceless")), None)
    if deps is None:
        return []
    return [f"compiled for the {deps['gpu']} without it ({deps.get('cuda_plugin')}); not done:",
            *(f"  - {line}" for line in deps.get("not_done") or ())]


# what compiler/reduced_dots.py rewrites, as inspect names it
REWRITTEN = {"lifted": "that the function lifted to float32", "one row": "of one row (a row of zeros more on the CPU)"}


def precision_line(m: Manifest) -> str:
    p = m.precision
    if not p:
        return ""
    return (f"{p['dtype']}, error against float32 {p['max_rel_error']:.3%} of the output scale (max abs "
            f"{p['max_abs_error']:.3g})" + (f", budget {p['max_error']:.2%}" if p.get("max_error") else ""))


def _speech_text(g: dict[str, Any]) -> list[str]:
    """A speech model's sources and reply opening, as ``inspect`` prints them (none for other models)."""
    if not g.get("source_shape"):
        return []
    audio, opening = g.get("audio") or {}, g.get("opening") or {}
    languages = sorted(t.strip("<|>") for t in opening.get("languages") or {})
    language = (opening["language"] if opening.get("language") else
                "detected per source among " + ", ".join(languages) if None in opening.get("forced", [None]) and
                languages else "the checkpoint's")
    return [f"  speech: sources are {' x '.join(map(str, g['source_shape']))} log-mel features of "
            f"{audio.get('chunk_length', 30)} s of {audio.get('sampling_rate', 16000)} Hz audio; replies open with "
            f"the language ({language}) and the task, unless a call names them"]


def manifest_text(root: Path, m: Manifest, index: dict[str, Any], seconds: dict[str, float],
                  costs: dict[str, Any] | None = None) -> str:
    """The artifact as ``inspect`` prints it: inputs, outputs, dims, profiles (``costs``: XLA's estimates per
    executable file), weights, files, toolchain, the build-key parts and a reduced precision's error."""
    out = [f"artifact: {root}", f"  function {m.function!r}, optimization_level {m.optimization_level}, "
           f"platforms {', '.join(m.platforms)}"]
    if m.entry:
        out += [f"  entries: {', '.join(m.entry_names)} (the first is called when the artifact is called); "
                "each weight is stored once and shared"]
    for name, e in m.all_entries():
        out += _entry_text(e, index, seconds, costs, f"entry {name!r} ({e.function}): " if name else "")
    if m.weights:
        out += ["", "weights"] + table(["weight", "argument", "dtype", "shape", "file"], [
            [w.path, w.argument or "-", w.dtype, w.shape, w.file or "(stored prepared)"] for w in m.weights])
        rest = sum(bool(c.at_rest) for c in m.prep.chunks) if m.prep else 0
        chunks = f"; precompiled in {len(m.prep.chunks)} chunk(s)" if m.prep and m.prep.chunks else ""
        chunks += f", {rest} stored prepared (placed at load as stored)" if rest else ""
        out.append(f"  prep program: {'yes (' + m.prep.file + chunks + ')' if m.prep else 'none (weights used as stored)'}")
    g = m.metadata.get("generate")
    if isinstance(g, dict):
        recorded = sorted((g.get("sampling") or {}).items(), key=lambda kv: kv[0] != "temperature")
        picked = " ".join(f"{k}={v:g}" for k, v in recorded) or "greedy"
        beams = g.get("beams") or {}
        searched = (f" (by score: the best of {beams['num_beams']} beams, length_penalty={beams['length_penalty']:g}, "
                    f"early_stopping={beams['early_stopping']})") if beams else ""
        out += ["", f"generation: {g['max_length']} cache positions; stops at {g.get('eos_token_id') or 'no id'}; "
                    f"calls that leave them out pick tokens by {picked}{searched}"]
        out += _speech_text(g)
    tokenizer = m.metadata.get("tokenizer") or []
    if tokenizer:
        out += ["", f"tokenizer: the checkpoint's, for text in and out ({', '.join(tokenizer)} under tokenizer/)"]
    sizes = file_sizes(m, index)
    out += ["", f"files ({human_size(sum(sizes.values()))})"] + table(
        ["file", "size"], [[k, human_size(v)] for k, v in sorted(sizes.items())])
    out += ["", "toolchain"] + table(["what", "value"], [[k, v] for k, v in sorted(m.toolchain.items())])
    out += ["  compiler options: " + json.dumps(m.compiler_options, sort_keys=True)]
    p = m.precision
    if p:
        out += ["", f"precision {p['dtype']}: max abs error {p['max_abs_error']:.3g}, max rel error "
                f"{p['max_rel_error']:.3g} against float32 on the self-test inputs"
                + (f" (budget {p['max_error']:g})" if p.get("max_error") is not None else "")]
        done = p.get("rewritten") or {}
        if done:
            out += [f"  products the build kept in {p['dtype']}: " + ", ".join(
                f"{n} {REWRITTEN.get(k, k)}" for k, n in sorted(done.items()))]
    if m.key_parts:
        out += ["", f"build key {(m.build_key or '')[:16]}"] + table(["part", "value"], [
            [k, json.dumps(v, sort_keys=True)[:100]] for k, v in sorted(m.key_parts.items())])
    return "\n".join(out)


def _entry_text(m: Manifest, index: dict[str, Any], seconds: dict[str, float], costs: dict[str, Any] | None,
                title: str) -> list[str]:
    """One entry's inputs, outputs, dims and profiles (``title`` heads each table in a multi-entry artifact)."""
    out = ["", f"{title}inputs"] + table(["input", "spec"], [[path, spec_text(info)] for path, info in m.leaves])
    if m.donated:
        out += [f"  donated (updated in place; a device buffer passed there is consumed): {', '.join(m.donated)}"]
    if m.sizes:
        passed = ", ".join(f"{path} = the true size of {size.name!r}" for path, size in m.sizes)
        out += [f"  passed to the function, not part of the signature: {passed}"]
    names = output_names(m.output_structure, len(m.outputs))  # as Python's dict and the server name them
    labels, scores = m.metadata.get("labels") or {}, m.metadata.get("scores") or {}
    out += ["", f"{title}outputs"] + table(["output", "spec", "labels"], [
        [n, spec_text(o), label_text(labels.get(n), scores.get(n))] for n, o in zip(names, m.outputs)])
    if m.dims:
        out += ["", f"{title}dims"] + table(["dim", "range", "opt", "strategy", "padding", "buckets",
                                             "compiled on first use"], [
            [d.name or d.symbol, f"[{d.bounds[0]}..{d.bounds[2]}]", d.bounds[1], m.strategy(d), d.padding or "-",
             " ".join(map(str, d.buckets)) or "-", first_use_compiles(d, m.strategy(d)) or "none"] for d in m.dims])
    rows = []
    for e in m.executables:
        c = (costs or {}).get(e.file, {})
        label = "every shape" if e.dynamic else " ".join(f"{k}={v}" for k, v in e.profile.items())
        rows.append([label or "static", platform_text(m, e.platform), e.file, human_size(index.get(e.file, {}).get("size", 0)),
                     f"{seconds.get(e.file, 0):.2f}", f"{c['flops'] / 1e6:.1f}" if c.get("flops") is not None else "-",
                     human_size(c["temp_bytes"]) if c.get("temp_bytes") is not None else "-"])
    c = m.compiler
    out += ["", f"{title}compiler: {c.name}" + (f", {c.mode}" if c.mode else "")
            + (" (weights stored twice: packed in the module, and as weights/)" if c.mode == "dynamic" else "")
            + (f" (the dynamic program was refused: {c.why})" if c.why else "")
            + (f", flags {' '.join(c.flags)}" if c.flags else "")]
    out += ["", f"{title}profiles ({len(rows)})"] + table(["profile", "platform", "file", "size", "compile s", "MFLOP",
                                                           "temp"], rows)
    out += [f"  {line}" for line in gpu_lines(m)]
    return out


LIST_COLUMNS = ("model", "inputs", "options", "profiles", "size", "date", "key")


def label_text(labels: Any, scored: Any = None, most: int = 8) -> str:
    """A classifier output's class names, in id order (``0 neg, 1 pos``), the first ``most`` of them, and the function
    that scores them where the build recorded one (``metadata.scores``: ``0 neg, 1 pos; scored by softmax``)."""
    if not isinstance(labels, list) or not labels:
        return ""
    shown = ", ".join(f"{i} {name}" for i, name in enumerate(labels[:most]))
    shown += f", ... ({len(labels)} classes)" if len(labels) > most else ""
    return shown + (f"; scored by {scored}" if isinstance(scored, str) else "")


def checkpoint_text(path: Path, m: Manifest) -> str:
    """A checkpoint as ``list`` names it: its folder's name (from the artifact's index) and its params' digest, so
    that two builds from two checkpoints are told apart: ``ckpt=bert-sst2@3f2a9c1d``."""
    from .read import read_index

    recorded = read_index(path, m, "checkpoint").get("path")
    digest = str((m.metadata.get("params") or {}).get("sha256") or "")[:8]
    return f"ckpt={Path(recorded).name if isinstance(recorded, str) else ''}@{digest}"


def list_row(path: Path) -> dict[str, str]:
    """``list``'s row for one artifact: model, inputs, options, profiles, size, date and key (or, for one whose
    manifest or index cannot be read, why)."""
    from .read import read_index, read_manifest

    date = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
    try:
        m = read_manifest(path)
        read_index(path, m)  # a damaged index makes the row say so
    except TripyBuildError as e:
        return {"model": path.parent.name, "inputs": "-", "options": f"damaged: {str(e).splitlines()[0][:80]}",
                "profiles": "-", "size": "-", "date": date, "key": path.name}
    config = m.build_config
    options = [m.compiler.name if m.compiler.name != "xla" else "+".join(m.platforms),
               f"O{m.optimization_level}", config["precision"]]
    for setting, shown in (("target_cpu", "cpu"), ("target_gpu", "gpu")):
        if config[setting] != RECORDED_CONFIG_DEFAULTS[setting]:  # a target other than the host's
            options.append(f"{shown}={config[setting]}")
    if (m.key_parts.get("params") or {}).get("init") == "checkpoint":
        options.append(checkpoint_text(path, m))
    if m.entry:
        options.append(f"entries={','.join(m.entry_names)}")
    return {"model": m.model, "inputs": "; ".join(f"{p} {spec_text(info)}" for p, info in m.leaves),
            "options": " ".join(options), "profiles": str(sum(len(e.executables) for _, e in m.all_entries())),
            "size": human_size(disk_size(path)),
            "date": date, "key": str(m.build_key or path.name)[:16]}
