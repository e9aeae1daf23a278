"""``python -m tripy_build verify PATH [--rebuild]``: prove an artifact intact and reproducible.

One line per check and a verdict; the exit status is non-zero if any check failed. Checks: the
manifest, every file's digest (manifest and sidecar index: the weights, programs, executables and
self-test files), no unlisted files, loading every precompiled profile, and the self-test run
through the loaded executables (including, for a padded artifact, a case that needs padding). ``--rebuild`` rebuilds from the
recorded config in a temporary directory and compares the byte-reproducible files by bytes and the
rest by behaviour.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

from ..artifact import selftest
from ..artifact.describe import human_size
from ..artifact.digest import recorded
from ..artifact.layout import reproducible_files
from ..artifact.manifest import Manifest
from ..artifact.read import check_digests, read_files, read_index, read_manifest, unlisted_files
from ..errors import TripyBuildError


class Report:
    def __init__(self, out=sys.stdout):
        self.out = out
        self.failed = 0
        self.passed = 0

    def check(self, ok: bool, name: str, detail: str = "") -> bool:
        self.passed += ok
        self.failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}{'  ' + detail if detail else ''}", file=self.out, flush=True)
        return ok

    def note(self, name: str, detail: str) -> None:
        print(f"WARN  {name}  {detail}", file=self.out, flush=True)

    def attempt(self, name: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except TripyBuildError as e:
            self.check(False, name, str(e))
            return None


def _file_checks(report: Report, root: Path) -> Manifest | None:
    manifest = report.attempt("manifest", lambda: read_manifest(root))
    if manifest is None:
        return None
    report.check(True, "manifest", f"schema_version {manifest.schema_version}, function {manifest.function!r}")
    index = report.attempt("index", lambda: read_index(root, manifest))
    listed = {rel: e.to_json() for rel, e in manifest.files.items()}
    tables = [("manifest", listed)] + ([("index", index)] if index is not None else [])
    for where, table in tables:
        for rel, entry in sorted(table.items()):
            ok = report.attempt(f"digest {rel}", lambda t={rel: entry}, w=where: check_digests(root, t, w, ()))
            if ok is not None:
                algorithm, digest = recorded(entry)
                report.check(True, f"digest {rel}", f"{algorithm} {digest[:16]}... ({where})")
    if index is not None:
        extra = unlisted_files(root)
        report.check(not extra, "no unlisted files", ", ".join(extra[:5]))
    return manifest


def _selftest_checks(report: Report, exe: Any, manifest: Manifest, files: dict[str, bytes], label: str = "") -> None:
    import jax

    entries = list(manifest.selftest)
    report.check(bool(entries), f"{label}self-test present", f"{len(entries)} cases")
    for case, rtol, atol in selftest.from_files(entries, files):
        shapes = " ".join("x".join(map(str, a.shape)) or "scalar" for a in case.inputs)
        try:
            ok, err = selftest.check(lambda *xs: jax.tree_util.tree_leaves(exe.call_flat(*xs)), case, rtol, atol)
        except TripyBuildError as e:
            report.check(False, f"{label}self-test {case.name}", str(e))
            continue
        report.check(ok, f"{label}self-test {case.name}", f"inputs {shapes}; max abs error {err:.2e} (rtol {rtol:g})")


def _every_selftest(report: Report, exe: Any, manifest: Manifest, root: Path, label: str = "") -> None:
    """The self-test of every entry (the whole artifact's for a single function)."""
    for name, m in manifest.all_entries():
        where = f"{label}entry {name}: " if name else label
        files = report.attempt(f"{where}self-test files", lambda m=m: read_files(root, selftest.file_names(m.selftest))[1])
        if files is not None:
            _selftest_checks(report, exe.entry(name) if name else exe, m, files, where)


def _load(report: Report, root: Path, label: str = "", trust_executables: bool = True) -> Any:
    from ..artifact.compat import CompatibilityWarning
    from ..runtime.loader import load

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CompatibilityWarning)
        exe = report.attempt(f"{label}load", lambda: load(root, warmup="none", trust_executables=trust_executables))
    for w in caught:
        if issubclass(w.category, CompatibilityWarning):
            report.note(f"{label}load", str(w.message))
    if exe is not None:
        every = list((exe.entries or {"": exe}).values())
        n = sum(len(e.profiles) for e in every)
        ok = report.attempt(f"{label}load", lambda: sum(e.load_all() for e in every))
        if ok is not None:
            how = "deserialized and usable here" if trust_executables else \
                "compiled here from the portable program (the shipped executables ignored)"
            report.check(True, f"{label}load", f"{n} precompiled profile(s) {how}; weights "
                                               f"{human_size(sum(w.nbytes for w in exe.compiled.program.weights))}")
    return exe


def _changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Which build-key parts differ, one level deep (``toolchain.tripy_build_source``)."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{sub}" for sub in sorted(set(a) | set(b)) if a.get(sub) != b.get(sub)]
        else:
            out.append(key)
    return out


def _rebuild(report: Report, root: Path, manifest: Manifest, checkpoint: str | None = None) -> None:
    from ..builder.key import request_from_record
    from ..builder.pipeline import build

    tmp = Path(tempfile.mkdtemp(prefix="tripy_build-verify-"))
    try:
        request = report.attempt("rebuild", lambda: request_from_record(manifest, root.absolute(), tmp, checkpoint))
        if request is None:
            return
        result = report.attempt("rebuild", lambda: build(request))
        if result is None:
            return
        report.check(True, "rebuild", str(result.path))
        rebuilt = read_manifest(result.path)
        changed = _changed_keys(manifest.key_parts, rebuilt.key_parts)
        report.check(not changed, "rebuild: same build key",
                     "differs in: " + ", ".join(changed) if changed else (manifest.build_key or "")[:16])
        for rel in reproducible_files(manifest):
            a, b = root / rel, result.path / rel
            same = b.is_file() and a.read_bytes() == b.read_bytes()
            report.check(same, f"rebuild: bytes {rel}", "identical" if same else "differ")
        rebuilt_params = (rebuilt.metadata.get("params") or {}).get("sha256")
        recorded_params = (manifest.metadata.get("params") or {}).get("sha256")
        report.check(rebuilt_params == recorded_params, "rebuild: params by value", (rebuilt_params or "")[:16])
        exe = _load(report, result.path, "rebuild: ")
        if exe is not None:
            _every_selftest(report, exe, manifest, root, "rebuild: ")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def verify(path: str | Path, rebuild: bool = False, out=sys.stdout, portable_only: bool = False,
           checkpoint: str | None = None) -> bool:
    """Run every check on the artifact at ``path``, printing one line each; True if all passed.

    ``portable_only``: run the self-test on executables compiled here from the exported program, never
    on the machine code the artifact ships (``load(..., trust_executables=False)``). ``checkpoint``: the
    params a rebuild reads, instead of the artifact's own weights (which an artifact saved with
    weights=prepared does not hold raw); the rebuild checks they are the recorded params by value.
    """
    report = Report(out)
    root = Path(path)
    manifest = _file_checks(report, root)
    if manifest is not None and report.failed == 0:
        exe = _load(report, root, trust_executables=not portable_only)
        if exe is not None:
            _every_selftest(report, exe, manifest, root)
        if rebuild:
            _rebuild(report, root, manifest, checkpoint)
    verdict = "VERIFIED" if report.failed == 0 else "FAILED"
    print(f"{verdict}: {root} ({report.passed} checks passed, {report.failed} failed)", file=out, flush=True)
    return report.failed == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tripy-build verify", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="an artifact directory")
    parser.add_argument("--rebuild", action="store_true", help="rebuild from the recorded config and compare")
    parser.add_argument("--portable-only", action="store_true",
                        help="never run the shipped executables: compile from the exported program and self-test those")
    parser.add_argument("--checkpoint", help="with --rebuild: the params to rebuild from; default: the checkpoint the "
                                             "artifact records it was built from, while it is there unchanged, else the "
                                             "artifact's own weights (weights=prepared does not hold them raw)")
    args = parser.parse_args(argv)
    if args.checkpoint and not args.rebuild:
        parser.error("--checkpoint is read by --rebuild only; add --rebuild")
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("absl").setLevel(logging.WARNING)
    return 0 if verify(args.path, rebuild=args.rebuild, portable_only=args.portable_only,
                       checkpoint=args.checkpoint) else 1


if __name__ == "__main__":
    sys.exit(main())
