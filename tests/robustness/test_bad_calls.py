"""Bad calls: each is refused before anything runs, with a ``CallError`` that names the input, the dim
and what was expected, by the compiled executable, the same artifact loaded by ``tb.load`` and by the
jax-free ``tripy_build.runtime``; a good call still works after each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

import tripy_build as tb
from tripy_build import runtime

B = tb.NamedDimension("batch", 1, 2, 8)


def f(x, y, d):
    return x.sum(1) + y.sum(1) + d["a"].sum() + d["b"][0].sum()


SPECS = [tb.InputInfo((B, 4), "float32"), tb.InputInfo((B, (1, 2, 4)), "float32"),
         {"a": tb.InputInfo((2,), "float32"), "b": [tb.InputInfo((3,), "int32")]}]
X = np.ones((3, 4), np.float32)
Y = np.ones((3, 2), np.float32)
D = {"a": np.ones(2, np.float32), "b": [np.ones(3, np.int32)]}


@pytest.fixture(scope="module")
def loaders(tmp_path_factory):
    exe = tb.compile(f, args=SPECS)
    path = tmp_path_factory.mktemp("calls") / "f"
    exe.save(path)
    return {"compiled": exe, "tb.load": tb.load(path), "runtime": runtime.load(path)}


# (id, args, kwargs, what the error must say)
CASES = [
    ("float64 for float32", (X.astype(np.float64), Y, D), {}, "input 'x' has dtype float64 but expected float32"),
    ("int32 for float32", (X.astype(np.int32), Y, D), {}, "input 'x' has dtype int32"),
    ("bfloat16 for float32", (np.asarray(jnp.ones((3, 4), jnp.bfloat16)), Y, D), {}, "dtype bfloat16"),
    ("float for an int leaf", (X, Y, {"a": D["a"], "b": [np.ones(3, np.float32)]}), {}, "input 'd.b[0]' has dtype float32"),
    ("rank too low", (np.ones(4, np.float32), Y, D), {}, "input 'x'"),
    ("rank too high", (np.ones((3, 4, 1), np.float32), Y, D), {}, "input 'x'"),
    ("dim above its max", (np.ones((9, 4), np.float32), np.ones((9, 2), np.float32), D), {}, "[1, 8]"),
    ("dim zero", (np.ones((0, 4), np.float32), np.ones((0, 2), np.float32), D), {}, "is 0, but it must be in range [1, 8]"),
    ("independent dim above its max", (X, np.ones((3, 5), np.float32), D), {}, "input 'y' dim 1"),
    ("static dim wrong", (np.ones((3, 5), np.float32), Y, D), {}, "input 'x' dim 1"),
    ("named dims differ", (X, np.ones((2, 2), np.float32), D), {}, "NamedDimension 'batch' must have one size"),
    ("a list", (X.tolist(), Y, D), {}, "input 'x' must be an array"),
    ("a scalar", (1.0, Y, D), {}, "input 'x' must be an array"),
    ("None", (None, Y, D), {}, "input 'x' must be an array"),
    ("a string", ("x", Y, D), {}, "input 'x' must be an array"),
    ("an object array", (np.array([object()] * 12).reshape(3, 4), Y, D), {}, "dtype object"),
    ("a dict missing a key", (X, Y, {"a": D["a"]}), {}, "input 'd' must be a dict with keys 'a', 'b'"),
    ("a dict with an extra key", (X, Y, {**D, "c": D["a"]}), {}, "input 'd' must be a dict with keys 'a', 'b'"),
    ("a tuple for a dict", (X, Y, (D["a"], D["b"])), {}, "input 'd' must be a dict"),
    ("a list of the wrong length", (X, Y, {"a": D["a"], "b": []}), {}, "input 'd.b' must be a list of 1"),
    ("too many arguments", (X, Y, D, X), {}, "takes 3 positional argument"),
    ("too few arguments", (X, Y), {}, "missing input(s) 'd'"),
    ("an unknown keyword", (X, Y, D), {"z": X}, "unexpected keyword argument 'z'"),
    ("an argument twice", (X, Y, D), {"x": X}, "multiple values for input 'x'"),
]


@pytest.mark.parametrize("loader", ["compiled", "tb.load", "runtime"])
@pytest.mark.parametrize("args,kwargs,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_call(loaders, loader, args, kwargs, needle):
    exe = loaders[loader]
    with pytest.raises(tb.TripyBuildError) as e:
        exe(*args, **kwargs)
    assert isinstance(e.value, TypeError), type(e.value)  # CallError is also a TypeError, as Python's own are
    assert needle in str(e.value), str(e.value)
    np.testing.assert_allclose(np.asarray(exe(X, Y, D)), np.asarray(f(X, Y, D)))


def test_array_on_another_device_names_the_input_and_the_fix():
    code = textwrap.dedent("""
        import jax, numpy as np, tripy_build as tb
        exe = tb.compile(lambda x: x * 2, args=[tb.InputInfo((tb.NamedDimension("batch", 1, 2, 8), 4), "float32")])
        x = jax.device_put(np.ones((3, 4), np.float32), jax.devices()[1])
        for _ in range(2):  # the second call takes the fast path of a seen shape
            try:
                exe(x)
                raise SystemExit("no error")
            except tb.TripyBuildError as e:
                print(e)
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and all("input 'x' is on cpu:1" in ln and "jax.device_put(x" in ln for ln in lines)


def test_the_catalogue_is_large_enough():
    assert len(CASES) + 1 >= 20
