"""What a build says when it is done: the artifact, its inputs and dims, its profiles, where the time went."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..artifact.describe import dim_lines, file_sizes, gpu_lines, human_size, precision_line, profiles_line, spec_text
from ..artifact.manifest import Manifest
from ..artifact.read import read_index
from ..core.profiles import first_use_compiles

log = logging.getLogger(__name__)


@dataclass
class BuildResult:
    path: Path
    key: str
    model: str
    cache_hit: bool
    timings: dict[str, float] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    dims: list[str] = field(default_factory=list)  # per dynamic dim: its buckets and strategy
    profiles: str = ""
    precision: str = ""  # the measured error of a reduced-precision build
    undone: list[str] = field(default_factory=list)  # what a build for a GPU that was not there left undone
    files: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # input files (model code, checkpoint) -> digest (digest.ALGORITHM)
    remote: str = ""  # the remote cache it was downloaded from, for a remote cache hit

    @property
    def size(self) -> int:
        return sum(self.files.values())

    def summary(self) -> str:
        hit = f"  (cache hit, downloaded from {self.remote})" if self.remote else "  (cache hit)" if self.cache_hit else ""
        lines = [f"artifact: {self.path}{hit}"]
        lines += [f"  input {name}: {desc}" for name, desc in self.inputs.items()]
        lines += [f"  dim {d}" for d in self.dims]
        if self.profiles:
            lines.append(f"  profiles: {self.profiles}")
        if self.precision:
            lines.append(f"  precision: {self.precision}")
        lines += [f"  {line}" for line in self.undone]
        if self.timings:
            lines.append("  stages: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in self.timings.items()))
        files = ", ".join(f"{k} {human_size(v)}" for k, v in sorted(self.files.items()))
        lines.append(f"  files ({human_size(self.size)}): {files}")
        return "\n".join(lines)


def warn_first_use_compiles(manifest: Manifest, seconds: dict[str, float]) -> None:
    """One warning for a build whose artifact compiles some in-range shapes on first use: which sizes of
    which dims, what such a compile costs (the profiles' mean compile time), and the fix. None for a
    ``task=generate`` artifact: its driver calls the entries in bucket-sized chunks only."""
    if manifest.metadata.get("generate"):
        return
    gaps = [(f"{name}: {d.name or d.symbol}" if name else d.name or d.symbol, text) for name, m in manifest.all_entries()
            for d in m.dims if (text := first_use_compiles(d, m.strategy(d)))]
    if not gaps:
        return
    mean = sum(seconds.values()) / len(seconds) if seconds else 0.0
    log.warning(
        "not every in-range shape is precompiled: %s compile on first use (~%.1f s each, the profiles' mean "
        "compile time; once per process, then kept in the compile cache). Declare how a dim may be padded "
        "(model.padding.<dim>=rows|mask, proven at build) to serve it from the buckets instead, or list the "
        "sizes you need in shapes.buckets.<dim>.",
        "; ".join(f"dim {name}: {text}" for name, text in gaps), mean)


def result_from_manifest(path: Path, key: str, model_name: str, cache_hit: bool, timings: dict[str, float],
                         manifest: Manifest, sources: dict[str, str]) -> BuildResult:
    """The ``BuildResult`` of the artifact at ``path``, described from its manifest and index."""
    index = read_index(Path(path), manifest)
    seconds = read_index(Path(path), manifest, "compile_seconds")
    entries = manifest.all_entries()  # (name, record): one unnamed for a single function
    return BuildResult(
        Path(path).absolute(), key, model_name, cache_hit, timings,
        inputs={f"{name}.{p}" if name else p: spec_text(info) for name, m in entries for p, info in m.leaves},
        dims=[f"{name}: {line}" if name else line for name, m in entries
              for line in dim_lines(m, generation=bool(manifest.metadata.get("generate")))],
        profiles="; ".join(f"{name}: {line}" if name else line for name, m in entries
                           if (line := profiles_line(m, index, seconds))),
        precision=precision_line(manifest), files=file_sizes(manifest, index), sources=sources,
        undone=gpu_lines(manifest))
