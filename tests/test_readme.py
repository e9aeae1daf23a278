"""Every shell command in the README and in the documentation pages runs as written; the site builds.

The README and each page of the documentation site (``docs/``, in ``mkdocs.yml``'s nav order) are run one by
one: a page's ```bash blocks in order as one script (so ``ART=...`` carries on to the lines after it within
the page, and to no other page: each sets what it uses), in a scratch directory of its own with this venv's
``bin`` first on ``PATH``. Only the lines that set up the venv this test already runs in, or that hold a
placeholder for the reader to fill in, are left out, by a pattern with its reason; a line that takes too long
at the page's sizes runs with smaller ones (``SMALLER``: overrides appended, with the reason); any other line
runs as written, so a new command is tested by default.

The documentation site builds with ``mkdocs build --strict`` (the ``docs`` extra: MkDocs, its Material theme,
mkdocstrings), which fails on a broken link, a missing anchor, a page left out of the nav, or a docstring
mkdocstrings cannot render; the Python API page holds every public name; the README links every page.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

SKIP = {
    r"^\$\(scripts/find-python\) -m venv ": "creates the venv: .ci/run runs the README's test command on a fresh checkout",
    r"^source \.venv/bin/activate": "this test already runs with the venv's bin first on PATH",
    r"^pip install ": "this venv has the extras installed",
    r"<key>|\bverify PATH\b": "a placeholder the reader fills in with an artifact's path (docs/trust.md's signing and "
                              "--portable-only lines)",
}

# pattern -> (arguments appended, why): the same build command at a size the suite can afford (anchored: a
# `tripy-build list model=...` line that names the same model is left as it is)
SMALLER = {
    r"^python -m tripy_build model=transformer": ("model.d_model=16 model.heads=2 model.d_ff=32 shapes.dims.batch=[1,2,2] "
                                                  "shapes.dims.seq=[1,16,32] shapes.buckets.seq=pow2:16",  # 4 profiles
                                                  "21 profiles of a 256-wide block up to (4, 512): ~40 s"),
    r"^python -m tripy_build -m ": ("model.dim_in=16 shapes.dims.batch=[1,2,4] artifacts_dir=sweep-artifacts",
                                    "8 builds at full width: ~40 s (kept apart: $ART is the newest full-size geglu)"),
    r"^python -m tripy_build model=(bert|hf) params.checkpoint": ("shapes.dims.batch=[1,1,2] shapes.dims.seq=[1,16,16] "
                                                                  "shapes.buckets.seq=[16]",  # the pages' texts: < 16 tokens
                                           "50 profiles of a tiny BERT up to (16, 512): ~20 s"),
    r"^python -m tripy_build model=gpt2 task=generate": ("shapes.dims.batch=[1,1,1] shapes.dims.seq=[1,8,8] "
                                                         "shapes.buckets.seq=[1,8]",
                                  "36 profiles of a tiny GPT-2 (prompt chunks up to 128, batch up to 8): ~40 s"),
    r"^python -m tripy_build model=hf task=generate": ("shapes.dims.batch=[1,1,1] shapes.dims.seq=[1,8,8] "
                                                       "shapes.buckets.seq=[1,8]",
                                                       "a tiny Qwen2's prompt chunks up to 127, batch up to 8: ~40 s"),
    r"^python -m tripy_build model=bart task=generate": ("shapes.buckets.batch=[1,4] shapes.dims.seq=[1,16,16] "
                                                         "shapes.buckets.seq=[16]",  # beams: batch 4, greedy: 1
                                  "15 profiles of a tiny BART (encode, decode: batch 1 2 4 x sources 16 32; reorder): "
                                  "15 s of CPU, 8 s at 6; the page's calls run one short source at batch 4 (its beams) "
                                  "and at 1"),
    r"^python -m tripy_build model=geglu backend=": ("model.dim_in=16 model.dim_out=32 shapes.dims.batch=[1,2,2]",
                                                     "7 profiles of a full-width GEGLU for the GPU, and again for the "
                                                     "CPU (its twin, or backend=[cpu,cuda]'s own): ~4.5 s a build, "
                                                     "~3 s at these"),
    r"tripy_build bench ": ("--stream 20 --shapes 1 --cold-rounds 1 --budget 0.05", "200 calls, 8 shapes: ~30 s"),
}

# page -> paths its commands must have made in its scratch directory (any one of a tuple)
MADE = {
    "README.md": [("artifacts/transformer",), ("artifacts/bert",)],
    "docs/configuration.md": [("artifacts/geglu",), ("gpu-artifacts/geglu",)],
    "docs/builds.md": [("generated/program.mlir",)],  # inspect --dump wrote the StableHLO
    "docs/own-model.md": [("artifacts/nnx_mlp", "artifacts/eqx_mlp")],
    "docs/huggingface.md": [("artifacts/bert",)],
    "docs/generation.md": [("artifacts/gpt2",), ("artifacts/qwen2",), ("artifacts/bart",)],
}


def pages() -> list[str]:
    """The README, then every page of the site in its nav's order (paths relative to the repository)."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]

    def walk(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, dict):
            return [p for value in entry.values() for p in walk(value)]
        return [p for item in entry for p in walk(item)]

    return ["README.md"] + [f"docs/{p}" for p in walk(nav)]


def commands(page: str) -> list[str]:
    text = (REPO / page).read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def skipped(line: str) -> str | None:
    """Why ``line`` is left out, or None."""
    return next((why for pattern, why in SKIP.items() if re.search(pattern, line)), None)


def smaller(line: str) -> str:
    """``line`` with the arguments ``SMALLER`` appends for it, before its comment."""
    for pattern, (extra, _) in SMALLER.items():
        if re.search(pattern, line):
            command, *comment = re.split(r"(\s+#\s)", line, maxsplit=1)
            return f"{command} {extra}{''.join(comment)}"
    return line


def to_run(page: str) -> list[str]:
    return [smaller(line) for line in commands(page) if not skipped(line)]


PAGES = [p for p in pages() if commands(p)]


def test_rules_and_pages():
    every = [line for page in pages() for line in commands(page)]
    run = [line for line in every if not skipped(line)]
    assert len(run) >= 30, run  # the commands did not all get skipped
    assert all(any(re.search(p, line) for line in run) for p in SMALLER), "a SMALLER pattern matches no command"
    assert all(any(re.search(p, line) for line in every) for p in SKIP), "a SKIP pattern matches no command"
    # every page of docs/ is on the site (mkdocs build --strict fails too; this says which); the README runs first
    assert sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")) == sorted(pages()[1:])
    assert set(MADE) <= set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_variables_are_set_within_the_page(page):
    """A ``$NAME`` a page's commands use is set by an earlier command of the same page (not by another page,
    nor by the environment the test happens to run in)."""
    known = {"PATH", "HOME", "XDG_CACHE_HOME"}
    for line in to_run(page):
        used = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", line))
        assert used <= known, f"{page}: {line!r} uses {sorted(used - known)}, which no earlier line of the page sets"
        known |= set(re.findall(r"(?:^|[;&|]\s*)([A-Z][A-Z0-9_]*)=", line))


@pytest.mark.parametrize("page", PAGES)
def test_shell_commands_run_as_written(page, tmp_path):
    run = to_run(page)
    if not run:
        pytest.skip(f"every command of {page} is left out: {sorted({skipped(line) for line in commands(page)})}")
    (tmp_path / "examples").symlink_to(REPO / "examples")
    script = "set -euo pipefail\n" + "\n".join(f"echo '>>> {i}'\n{line}" for i, line in enumerate(run))
    env = {k: v for k, v in os.environ.items() if not re.fullmatch(r"ART|GPT2|CLS|SERVER", k)}
    env |= {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": ""}
    # its own process group, output to files: a command that leaves a process behind (a server not stopped) is
    # named, not waited on
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, stdout=out, stderr=err, text=True, env=env,
                                start_new_session=True)
        try:
            proc.wait(timeout=600)
            left = _group_alive(proc.pid)
        finally:
            _kill_group(proc.pid)
    stdout, stderr = (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()
    done = re.findall(r">>> (\d+)", stdout)
    failed_at = run[int(done[-1])] if done else "(before the first command)"
    # a command that fails first: the script stops there, and may leave a process the next command would stop
    assert proc.returncode == 0, f"{page}: command failed: {failed_at}\n{stdout[-2000:]}\n{stderr[-3000:]}"
    assert not left, f"{page}: commands left processes running: {left}"
    assert len(done) == len(run)
    for paths in MADE.get(page, []):
        assert any((tmp_path / p).exists() for p in paths), f"{page}: none of {paths} was made"


# the names the Python API page documents, by the id mkdocstrings gives each heading
API = ["tripy_build.compiler.pipeline.compile", "tripy_build.InputInfo", "tripy_build.NamedDimension",
       "tripy_build.DimSize", "tripy_build.Entry", "tripy_build.runtime.loader.load",
       "tripy_build.runtime.executable.Executable", "tripy_build.runtime.load", "tripy_build.runtime.Runtime",
       "tripy_build.TripyBuildError", "tripy_build.artifact.compat.CompatibilityWarning"]


def test_site_builds_strict(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the docs extra: pip install -e '.[docs]'")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    log = proc.stdout + proc.stderr
    warnings = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert proc.returncode == 0 and not warnings, log[-5000:]
    api = (site / "api" / "index.html").read_text()
    missing = [name for name in API if f'id="{name}"' not in api]
    assert not missing, f"the Python API page does not document {missing}"
    for page in (REPO / "docs").glob("*.md"):
        assert (site / ("" if page.stem == "index" else page.stem) / "index.html").is_file(), page.name


def test_readme_maps_every_page():
    readme = (REPO / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme))
    assert all((REPO / path).is_file() for path in linked), sorted(p for p in linked if not (REPO / p).is_file())
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages <= linked, f"pages the README's map does not link: {sorted(pages - linked)}"
    assert len(readme.splitlines()) <= 200, "the README is a five-minute read: the rest belongs in docs/"


def test_public_names_documented():
    """Every public name of ``tripy_build`` that is a function or class is on the Python API page (its
    ``::: path`` directives), so a new public name is not left out of the reference."""
    api = (REPO / "docs" / "api.md").read_text()
    directives = set(re.findall(r"^::: (\S+)", api, flags=re.M))
    import tripy_build

    for name in tripy_build.__all__:
        if name == "__version__":
            continue
        obj = getattr(tripy_build, name)
        paths = {f"tripy_build.{name}", f"{obj.__module__}.{obj.__qualname__}"}
        assert paths & directives, f"tripy_build.{name} is not on docs/api.md"


def _group_alive(pgid: int) -> list[str]:
    """The command lines of the processes still in process group ``pgid``."""
    out = subprocess.run(["ps", "-eo", "pgid=,args="], capture_output=True, text=True).stdout
    return [line.split(None, 1)[1] for line in out.splitlines() if line.split(None, 1)[0] == str(pgid)]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
