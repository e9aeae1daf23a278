"""A profile compiled on this host from the record's exported program, with the options its platform's
executables were compiled with, through the compile cache (``runtime/compile_here.py``)."""

from __future__ import annotations

import dataclasses
import logging

import jax.numpy as jnp
import numpy as np

from conftest import DIM_IN, assert_close, geglu
from tripy_build.runtime.compile_here import compile_profile


def test_a_shape_no_profile_covers_compiles_once_then_comes_from_the_cache(geglu_exe, geglu_params, tmp_path,
                                                                          monkeypatch, caplog, rng):
    monkeypatch.setenv("TRIPY_BUILD_CACHE_DIR", str(tmp_path / "cache"))
    model = geglu_exe.compiled
    assert (3,) not in {p.target for p in model.profiles}
    x = rng.standard_normal((3, DIM_IN)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="tripy_build"):
        first = compile_profile(model, (3,))
        second = compile_profile(model, (3,))
    assert "compiled x_d0=3 on first use" in caplog.text and "x_d0=3 loaded from the compile cache" in caplog.text
    for fn in (first, second):
        assert_close(fn(*model.leading, x, *[np.int32(3)] * len(model.sizes)), geglu(jnp.asarray(x), geglu_params))
    assert len(list((tmp_path / "cache").glob("*-cache"))) == 1


def test_the_recorded_options_are_the_options_it_compiles_with(geglu_exe, tmp_path, monkeypatch, caplog):
    """Another record's options are another compile (another cache entry), never the first's executable."""
    monkeypatch.setenv("TRIPY_BUILD_CACHE_DIR", str(tmp_path / "cache"))
    model = geglu_exe.compiled
    other = dataclasses.replace(model, compiler_options={"cpu": {**model.compiler_options.get("cpu", {}),
                                                                 "xla_backend_optimization_level": 0}})
    with caplog.at_level(logging.INFO, logger="tripy_build"):
        compile_profile(model, (5,))
        compile_profile(other, (5,))
    assert caplog.text.count("compiled x_d0=5 on first use") == 2 and "compile cache" not in caplog.text
    assert len(list((tmp_path / "cache").glob("*-cache"))) == 2
