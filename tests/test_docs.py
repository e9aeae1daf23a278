"""The documentation site builds with no warning, and the README's map of it is whole.

``mkdocs build --strict`` (the ``docs`` extra: MkDocs, its Material theme, mkdocstrings) fails on a broken
link, a missing anchor, a page left out of the nav, or a docstring mkdocstrings cannot render; the Python API
page must hold every public name it documents. The README links every page, and every link of the README
into ``docs/`` names a page that exists. (``tests/test_readme.py`` runs the pages' commands.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

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
