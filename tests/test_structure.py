"""The house: subpackages by role, imports only downward, no import cycles, a load path that imports only
what it runs, and a build key that only the code a build runs can change."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BATCH, DIM_IN

PACKAGE = Path(__file__).resolve().parents[1] / "tripy_build"

# What each part of the package may import (besides itself and the standard library): the layers, from the
# ground up, are core <- artifact <- runtime <- compiler <- build <- cli, with serve on runtime and the zoo on
# core. errors, host, version and jaxlib_api are leaves everything may use; the package's face (__init__, __main__) is on top.
LEAVES = {"errors", "host", "version", "jaxlib_api"}
ALLOWED = {
    "leaf": {"leaf"},
    "core": {"leaf"},
    "models": {"leaf", "core"},
    "artifact": {"leaf", "core"},
    "runtime": {"leaf", "core", "artifact"},
    "compiler": {"leaf", "core", "artifact", "runtime"},
    "builder": {"leaf", "core", "artifact", "runtime", "compiler", "models"},
    "serve": {"leaf", "core", "artifact", "runtime"},
    "cli": {"leaf", "core", "artifact", "runtime", "compiler", "builder", "models", "serve", "conf"},
    "face": {"leaf", "core", "artifact", "runtime", "compiler", "builder", "models", "serve", "cli"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return "face"
    if parts[1] in LEAVES:
        return "leaf"
    return parts[1]


def imports() -> dict[str, set[str]]:
    """Every tripy_build module -> the tripy_build modules it imports (at the top or inside a function)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
            for t in targets:
                while t and t not in modules and "." in t:
                    t = t.rpartition(".")[0]
                if t in modules and t != name and t.startswith("tripy_build"):
                    found.add(t)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(imports()) == []


def test_imports_go_only_down_the_layers():
    upward = [f"{a} -> {b}" for a, targets in sorted(imports().items()) for b in sorted(targets)
              if _part(b) != _part(a) and _part(b) not in ALLOWED[_part(a)]]
    assert upward == [], "imports from a lower layer up to a higher one:\n" + "\n".join(upward)


def test_the_checks_see_a_cycle_and_an_upward_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "artifact" not in ALLOWED["core"] and "compiler" not in ALLOWED["runtime"]


def private_reads(sources: dict[str, str]) -> list[str]:
    """Every read of another part's private name: ``x._name`` (``x`` not ``self`` or ``cls``) or ``from .. import
    _name`` in a module of one part (a subpackage, or the leaves) where only modules of other parts define
    ``_name`` (a function, class, module variable or ``self._name``). ``sources``: module name -> its code."""
    trees = {name: ast.parse(code) for name, code in sources.items()}
    defined: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for node in ast.walk(tree):
            found = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found = [node.name]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                found = [node.attr]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                found = [t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                         if isinstance(t, ast.Name)]
            for n in found:
                if n.startswith("_") and not n.startswith("__"):
                    defined.setdefault(n, set()).add(_part(name))
    reads = []
    for name, tree in sorted(trees.items()):
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names = [node.attr]
            elif isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
            for n in names:
                if n.startswith("_") and not n.startswith("__") and defined.get(n) and _part(name) not in defined[n]:
                    reads.append(f"{name}:{node.lineno} reads {n} ({', '.join(sorted(defined[n]))}'s)")
    return reads


def test_no_part_reads_another_parts_private_names():
    """What a subpackage shares with another is public: the compiled model is a record (``runtime/compiled.py``),
    not an executable's private fields."""
    reads = private_reads({name: path.read_text() for name, path in _modules().items()})
    assert reads == [], "private names read across subpackages:\n" + "\n".join(reads)


def test_the_private_name_check_sees_a_read_across_parts():
    sources = {"tripy_build.runtime.exe": "class E:\n    def __init__(self):\n        self._model = 1\n",
               "tripy_build.runtime.other": "def f(e):\n    return e._model\n",
               "tripy_build.cli.show": "def g(e):\n    return e._model + e.public\n",
               "tripy_build.compiler.make": "from ..runtime.exe import _helper\n",
               "tripy_build.runtime.helpers": "def _helper():\n    pass\n"}
    assert private_reads(sources) == ["tripy_build.cli.show:2 reads _model (runtime's)",
                                      "tripy_build.compiler.make:1 reads _helper (runtime's)"]


LOAD_PATH_FORBIDDEN = ("tripy_build.compiler", "tripy_build.builder", "tripy_build.cli", "tripy_build.serve",
                       "hydra", "omegaconf", "orbax", "argparse")


def _modules_after(code: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(proc.stdout.split())


@pytest.mark.parametrize("loader", ["tripy_build.runtime", "tripy_build.load"])
def test_the_load_path_imports_only_what_it_runs(loader, geglu_artifact):
    """Loading an artifact and calling it imports none of the compiler, the build, the CLI or the server, nor
    Hydra, OmegaConf, orbax or argparse; the jax-free loader not jax either. (``import jax`` itself imports
    argparse, through etils, which orbax installs: what jax imports on its own is jax's, not the load path's.)"""
    load = (f"from tripy_build import runtime; run = runtime.load({str(geglu_artifact)!r})"
            if loader == "tripy_build.runtime" else
            f"import tripy_build as tb; run = tb.load({str(geglu_artifact)!r}, warmup='none')")
    loaded = _modules_after(f"import numpy as np\n{load}\nrun(np.ones(({BATCH[1]}, {DIM_IN}), np.float32))")
    jax_own = _modules_after("import jax") if loader == "tripy_build.load" else set()
    bad = sorted(m for m in loaded - jax_own
                 if any(m == f or m.startswith(f + ".") for f in LOAD_PATH_FORBIDDEN))
    assert bad == [], f"{loader} imported {bad}"
    if loader == "tripy_build.runtime":
        assert "jax" not in loaded and "argparse" not in loaded
    assert "tripy_build.runtime.pjrt" in loaded or "tripy_build.runtime.executable" in loaded


def test_the_build_key_covers_the_code_a_build_runs_and_not_the_server_or_cli(tmp_path, monkeypatch):
    """``package_digest`` follows the subpackages a build runs, recursively: an edit there changes every build
    key; an edit to the CLI, the server or the zoo changes none (a model's source is a key part of its own)."""
    import shutil

    from tripy_build.builder import key

    copy = tmp_path / "tripy_build"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(key, "__file__", str(copy / "builder" / "key.py"))
    before = key.package_digest()
    for edited in ("cli/app.py", "serve/http.py", "cli/config.py", "models/geglu.py", "conf/config.yaml"):
        with open(copy / edited, "a") as f:
            f.write("\n# an edit\n")
        assert key.package_digest() == before, edited
    for edited in ("core/dispatch.py", "compiler/optimization.py", "artifact/manifest.py", "runtime/save.py"):
        (copy / edited).write_text((copy / edited).read_text() + "\n# an edit\n")
        assert key.package_digest() != before, edited
        before = key.package_digest()


def test_ruff_reads_every_python_file_of_the_package_and_the_tests():
    """No folder of ours is one that a tool skips by its name (a subpackage called build/ was never linted)."""
    import subprocess
    import sys

    listed = subprocess.run([sys.executable, "-m", "ruff", "check", "--show-files", "."], cwd=PACKAGE.parent,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    read = {Path(line.strip()).resolve() for line in listed.stdout.splitlines() if line.strip().endswith(".py")}
    ours = [p.resolve() for root in ("tripy_build", "tests") for p in (PACKAGE.parent / root).rglob("*.py")
            if "__pycache__" not in p.parts]
    skipped = sorted({str(p.parent.relative_to(PACKAGE.parent)) for p in ours if p not in read})
    assert not skipped, f"ruff skips these folders: {skipped}"
