"""Shared fixtures for the core API tests.

Compiles are the expensive part of this suite, so the executables and artifacts that many tests use
are built once per session. Tests that modify an artifact copy it first (``artifact_copy``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hydra import compose, initialize_config_module

import prestarted
import tripy_build as tb
from schedule import pytest_addoption, pytest_configure, pytest_xdist_make_scheduler  # noqa: F401 (the suite's hooks)

RTOL = 1e-5
ATOL = 1e-5

DIM_IN = 16
DIM_OUT = 32
BATCH = (1, 4, 8)  # (min, opt, max) of the GEGLU's dynamic batch dim


def geglu(x, params):
    """GEGLU: a linear projection to 2 * dim_out, split into a value and a GELU gate."""
    proj = x @ params["w"] + params["b"]
    value, gate = jnp.split(proj, 2, axis=-1)
    return value * jax.nn.gelu(gate)


def make_geglu_params(dim_in: int = DIM_IN, dim_out: int = DIM_OUT, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": (rng.standard_normal((dim_in, 2 * dim_out)) / np.sqrt(dim_in)).astype(np.float32),
        "b": (0.1 * rng.standard_normal(2 * dim_out)).astype(np.float32),
    }


def reproducible_files(root: Path) -> dict[str, bytes]:
    """The byte-reproducible files of every artifact under ``root`` (``reproducible_tree``)."""
    from tripy_build.artifact.read import reproducible_tree

    return reproducible_tree(root)


def default_sweep_dir(cwd: Path) -> Path:
    """The one sweep directory a ``-m`` run made under Hydra's default ``hydra.sweep.dir``
    (``multirun/<date>/<time>`` in its working directory ``cwd``), as users run sweeps: every job of the
    sweep must have written there, and the sweep's shared init must be gone."""
    from tripy_build.cli import sweep

    found = sorted(p for p in (cwd / "multirun").glob("*/*") if p.is_dir())
    assert len(found) == 1, f"one sweep directory expected under {cwd / 'multirun'}, found {found}"
    assert not (found[0] / sweep.SHARED_INIT).exists()
    return found[0]


def assert_close(actual, expected, rtol: float = RTOL, atol: float = ATOL) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != expected {expected.shape}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != expected {expected.dtype}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def sum_tolerance(expected, terms: int) -> float:
    """The absolute tolerance of a float32 result that sums ``terms`` products (over every contraction on its
    path): the worst-case rounding bound ``terms * eps * scale``, with the scale the largest magnitude expected.
    Two correct compilations (another CPU's vector width, another summation order) differ within it; one CPU's
    rounding is no bound (an AMD host differed by 2.6e-7 of the scale where an Intel one gave equal bits)."""
    return float(terms * np.finfo(np.float32).eps * np.abs(np.asarray(expected, np.float64)).max())


def info_summary(value):
    """A plain-data description of an InputInfo (or a container of them), for comparisons."""
    if isinstance(value, tb.InputInfo):
        return {
            "min": tuple(value.shape_bounds.min),
            "opt": tuple(value.shape_bounds.opt),
            "max": tuple(value.shape_bounds.max),
            "dtype": np.dtype(value.dtype).name,
            "names": {int(k): v for k, v in value.dimension_names.items()},
        }
    if isinstance(value, dict):
        return {"dict": {k: info_summary(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [info_summary(v) for v in value]}
    raise TypeError(f"not an InputInfo or container: {value!r}")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def geglu_params():
    return make_geglu_params()


@pytest.fixture(scope="session")
def geglu_ref(geglu_params):
    """Eager JAX reference for the session's GEGLU."""
    return lambda x: geglu(jnp.asarray(x), geglu_params)


@pytest.fixture(scope="session")
def geglu_exe(geglu_params):
    """GEGLU compiled for x: (batch in [1, 8], opt 4) x 16, float32; params are constants."""
    return tb.compile(geglu, args=(tb.InputInfo((BATCH, DIM_IN), "float32"), geglu_params))


@pytest.fixture(scope="session")
def geglu_artifact(geglu_exe, tmp_path_factory) -> Path:
    """The session's GEGLU saved once; never modified (copy it with ``artifact_copy``)."""
    path = tmp_path_factory.mktemp("geglu") / "artifact"
    geglu_exe.save(path)
    return path


@pytest.fixture
def artifact_copy(geglu_artifact, tmp_path) -> Path:
    """A private, writable copy of the GEGLU artifact."""
    dest = tmp_path / "artifact"
    shutil.copytree(geglu_artifact, dest)
    return dest


@pytest.fixture(scope="session")
def pair_exe():
    """f(a, b) = (a + b, a * b) with a NamedDimension 'batch' shared by both inputs."""
    batch = tb.NamedDimension("batch", 1, 3, 6)

    def pair(a, b):
        return a + b, a * b

    return tb.compile(pair, args=(tb.InputInfo((batch, 5), "float32"), tb.InputInfo((batch, 5), "float32")))


@pytest.fixture(scope="session")
def nested_exe():
    """A function of nested runtime inputs: d = {'a': x, 'b': [y, (u, v)]} and a scale constant."""

    def nested(d, scale):
        y, (u, v) = d["b"][0], d["b"][1]
        return d["a"] * scale + y, u - v

    d = {
        "a": tb.InputInfo(((1, 2, 4), 3), "float32"),
        "b": [tb.InputInfo((3,), "float32"), (tb.InputInfo((2,), "int32"), tb.InputInfo((2,), "int32"))],
    }
    return tb.compile(nested, args=(d, 2.5)), nested


BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts XLA backend compiles (jax.monitoring events) while it is registered."""

    def __init__(self):
        self.events: list[str] = []

    def __call__(self, event: str, duration: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            self.events.append(event)

    @property
    def count(self) -> int:
        return len(self.events)


@pytest.fixture
def compile_counter():
    counter = CompileCounter()
    jax.monitoring.register_event_duration_secs_listener(counter)
    try:
        yield counter
    finally:
        jax.monitoring.unregister_event_duration_listener(counter)


@pytest.fixture(scope="session", autouse=True)
def isolated_memo(tmp_path_factory):
    """Build commands run by tests keep their invocation memo in a private cache directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
        yield


# --- the build command, for the tests of every layer that build through it -------------------------

SMALL = {
    "geglu": ["model.dim_in=16", "model.dim_out=8"],
    "mlp": ["model.dim_in=16", "model.hidden=32", "model.dim_out=8", "model.layers=2"],
    "transformer": ["model.d_model=16", "model.heads=2", "model.d_ff=32"],
    "convnet": ["model.channels=[4,8]"],
}
SMALL_SHAPES = {
    "dynamic": ["shapes.dims.batch=[1,2,4]", "shapes.dims.seq=[1,4,8]", "shapes.dims.height=[4,8,12]",
                "shapes.dims.width=[4,8,12]"],
    "static": ["shapes.dims.batch=2", "shapes.dims.seq=4", "shapes.dims.height=8", "shapes.dims.width=8"],
}


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 300
            ) -> subprocess.CompletedProcess:
    """``python -m tripy_build ARGS`` in ``cwd`` (None: this process's), with ``env`` added to this process's
    environment, its output captured as text; forked from a process that has imported the package
    (``prestarted.py``)."""
    return prestarted.run_cli(*args, cwd=Path.cwd() if cwd is None else cwd, env={**os.environ, **(env or {})},
                              timeout=timeout)


def compose_cfg(overrides: list[str]):
    """The build command's config for ``overrides``, composed by Hydra's compose API."""
    from tripy_build.cli import config

    config.register()
    with initialize_config_module(config_module="tripy_build.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def model_reference(request, x_by_name):
    """The model a build request names, applied to its init at the request's seed (traced at the inputs' own shapes:
    unpadded, no lengths)."""
    from tripy_build.builder.model import instantiate as instantiate_model

    model = instantiate_model(request.model)
    params = model.init(jax.random.PRNGKey(request.params_seed))
    return np.asarray(jax.jit(model.apply)(params, *x_by_name.values()))


@pytest.fixture
def call_in_flight():
    """A call in flight, as a server thread would have one (held here by the gate itself), until released."""
    import threading

    from tripy_build.runtime import warmup

    started, release = threading.Event(), threading.Event()

    def long_call():
        with warmup.calls:
            started.set()
            release.wait(30)

    caller = threading.Thread(target=long_call)
    caller.start()
    started.wait(30)
    yield release
    release.set()
    caller.join(30)


def compare_outputs(ours: dict, theirs: object, mask: np.ndarray, names: tuple[str, ...], tol: float = 1e-4) -> float:
    """Each output of ours against the PyTorch model's output of the same name, within ``tol`` of its scale (max abs
    error / max abs reference), at the real positions (``mask``'s 1s) of per-position outputs; ours has exactly the
    ``names`` PyTorch's has. The worst error."""
    assert set(ours) == {k for k in names if getattr(theirs, k, None) is not None}
    worst = 0.0
    for name, got in ours.items():
        got, want = np.asarray(got), getattr(theirs, name).numpy()
        assert got.shape == want.shape, name
        if got.ndim >= 2 and got.shape[1] == mask.shape[1]:  # per position: only the real ones
            got, want = got[mask.astype(bool)], want[mask.astype(bool)]
        error = float(np.abs(got - want).max() / np.abs(want).max())
        assert error <= tol, (name, error)
        worst = max(worst, error)
    return worst

