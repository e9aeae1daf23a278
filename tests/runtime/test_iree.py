"""backend=iree: the exported program compiled by IREE, served through the same Executable API.

Every zoo model is compiled by both compilers and compared at the edges of its ranges. IREE takes the
GEGLU and the MLP as one dynamic-shape module; the transformer block and the convnet fall back to one
module per profile, with IREE's reason in the manifest (IREE 3.13 cannot lower some of the dynamic ops
JAX emits for them). Skipped, with the reason, where IREE is not installed (``pip install -e '.[iree]'``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

pytest.importorskip("iree.runtime", reason="IREE is an optional extra: pip install -e '.[iree]'")

import tripy_build as tb
from tripy_build import runtime
from tripy_build.cli import config
from tripy_build.runtime import iree as iree_backend
from tripy_build.builder.pipeline import build
from tripy_build.models import ConvNet, GEGLU, MLP, TransformerBlock, input_infos

from conftest import SMALL, compose_cfg, model_reference

KEY = jax.random.PRNGKey(0)

# model, dim ranges, buckets, the mode IREE 3.13 compiles it in. The convnet's sizes avoid 2..4 pixels,
# where IREE 3.13 refuses its strided, padded convolutions (see test_a_program_iree_refuses_is_a_compile_error).
CASES = {
    "geglu": (GEGLU(16, 32), {"batch": (1, 4, 9)}, {}, "dynamic"),
    "mlp": (MLP(dim_in=16, hidden=32, dim_out=8, layers=3), {"batch": (1, 4, 9)}, {}, "dynamic"),
    "transformer": (TransformerBlock(d_model=32, heads=4, d_ff=64), {"batch": (1, 2, 3), "seq": (1, 8, 16)},
                    {"batch": [2, 3], "seq": [8, 16]}, "profiles"),
    "convnet": (ConvNet(channels_in=3, channels=(8, 16), classes=5),
                {"batch": (1, 2, 2), "height": (5, 8, 9), "width": (5, 8, 9)},
                {"batch": [2], "height": [8, 9], "width": [9]}, "profiles"),
}


def compile_both(name):
    model, dims, buckets, _ = CASES[name]
    params = model.init(KEY)
    masks = {d: tb.DimSize(d) for d, kind in model.padding.items() if kind == "mask"}

    def make(backend):
        return tb.compile(model.apply, args=[params, *input_infos(model, dims).values()],
                          kwargs={"lengths": masks} if masks else None, buckets=buckets, padding=model.padding,
                          backend=backend)
    return model, params, make("xla"), make("iree")


def edge_inputs(model, dims, seed=0):
    """Inputs at every dim's min, max and one above min, the other dims at opt."""
    rng = np.random.default_rng(seed)
    for dim, (lo, _, hi) in dims.items():
        for n in sorted({lo, min(lo + 1, hi), hi}):
            sizes = {d: (n if d == dim else r[1]) for d, r in dims.items()}
            yield [rng.standard_normal([sizes[d] if isinstance(d, str) else d for d in shape]).astype(np.float32)
                   for shape in model.inputs().values()]


@pytest.fixture(scope="module", params=sorted(CASES))
def both(request):
    return request.param, *compile_both(request.param)


def test_every_zoo_model_matches_xla_within_float32_tolerance(both):
    name, model, params, xla, iree = both
    assert xla.compiler.name == "xla" and xla.compiler.mode is None
    assert iree.compiler.name == "iree" and iree.compiler.mode == CASES[name][3]
    if iree.compiler.mode == "profiles":
        assert "failed to legalize operation 'stablehlo.dynamic_" in iree.compiler.why
    for xs in edge_inputs(model, CASES[name][1]):
        want = np.asarray(xla(*xs))
        got = np.asarray(iree(*xs))
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_saved_iree_artifact_loads_and_runs_with_either_loader(both, tmp_path):
    name, model, params, xla, iree = both
    iree.save(tmp_path / "a")
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["compiler"]["name"] == "iree" and m["compiler"]["mode"] == CASES[name][3]
    assert all(e["format"] == "iree-vmfb" and e["file"].endswith(".vmfb") for e in m["executables"])
    assert {e["depends_on"]["iree-base-compiler"] for e in m["executables"]} == {iree_backend.versions()["iree-base-compiler"]}
    if CASES[name][3] == "dynamic":
        assert len(m["executables"]) == 1 and m["executables"][0]["dynamic"]
        assert {d["strategy"] for d in m["dims"]} == {"dynamic"}
    loaded = tb.load(tmp_path / "a", warmup="now")
    assert loaded.compiler == iree.compiler
    rt = runtime.load(tmp_path / "a")
    for xs in edge_inputs(model, CASES[name][1], seed=1):
        want = np.asarray(iree(*xs))
        np.testing.assert_array_equal(np.asarray(loaded(*xs)), want)
        np.testing.assert_array_equal(rt(*xs), want)


def test_inputs_are_checked_as_for_xla(both):
    name, model, params, xla, iree = both
    dim, (lo, opt, hi) = next(iter(CASES[name][1].items()))
    sizes = {d: (hi + 1 if d == dim else r[1]) for d, r in CASES[name][1].items()}
    xs = [np.zeros([sizes[d] if isinstance(d, str) else d for d in shape], np.float32)
          for shape in model.inputs().values()]
    with pytest.raises(tb.TripyBuildError) as e_iree:
        iree(*xs)
    with pytest.raises(tb.TripyBuildError) as e_xla:
        xla(*xs)
    assert str(e_iree.value) == str(e_xla.value) and f"[{lo}, {hi}]" in str(e_iree.value).replace("..", ", ")


def test_dynamic_module_runs_without_jax_or_jaxlib(tmp_path):
    _, _, _, iree = compile_both("geglu")
    iree.save(tmp_path / "a")
    script = textwrap.dedent(f"""
        import sys, numpy as np
        from tripy_build import runtime
        rt = runtime.load({str(tmp_path / 'a')!r})
        for n in (1, 5, 9):
            y = rt(np.ones((n, 16), np.float32))
            assert y.shape == (n, 32), y.shape
        print("jax" in sys.modules, "jaxlib" in sys.modules)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "False"]


def test_weights_of_a_dynamic_module_cannot_be_swapped_but_inputs_can_be_bound():
    model, params, _, iree = compile_both("geglu")
    other = jax.tree_util.tree_map(lambda a: a * 2, params)
    with pytest.raises(tb.TripyBuildError, match="holds its weights as constants"):
        iree.bind(params=other)


def test_a_shape_no_profile_covers_is_compiled_by_iree_too():
    model, dims, _, _ = CASES["transformer"]
    params = model.init(KEY)
    exe = tb.compile(model.apply, args=[params, *input_infos(model, dims).values()],
                     kwargs={"lengths": {"seq": tb.DimSize("seq")}}, buckets={"batch": [3], "seq": [16]},
                     padding={}, backend="iree")  # no padding: other shapes compile on first use
    x = np.random.default_rng(0).standard_normal((2, 5, 32)).astype(np.float32)
    y = exe(x)
    compiled = [f for t, f in exe._by_target.items() if t == (2, 5)]
    assert compiled and isinstance(compiled[0], iree_backend.Module)
    np.testing.assert_allclose(np.asarray(y), np.asarray(model.apply(params, x, lengths={"seq": 5})),
                               rtol=1e-4, atol=1e-5)


def test_a_program_iree_refuses_is_a_compile_error():
    model = ConvNet(channels_in=3, channels=(8, 16), classes=5)
    dims = {"batch": (2, 2, 2), "height": (4, 4, 4), "width": (4, 4, 4)}
    with pytest.raises(tb.TripyBuildError) as e:
        tb.compile(model.apply, args=[model.init(KEY), *input_infos(model, dims).values()],
                   kwargs={"lengths": {"height": tb.DimSize("height"), "width": tb.DimSize("width")}},
                   padding=model.padding, backend="iree")
    assert "IREE cannot compile the program for the input shapes (2, 4, 4, 3)" in str(e.value)
    assert "backend=cpu" in str(e.value)


def test_build_command_with_backend_iree_records_the_compiler_in_key_and_summary(tmp_path):
    overrides = ["model=mlp", *SMALL["mlp"], "shapes=dynamic", "shapes.dims.batch=[1,2,4]",
                 f"artifacts_dir={tmp_path / 'arts'}"]
    build_request = config.validate(compose_cfg([*overrides, "backend=iree"]))
    assert build_request.compiler == "iree" and build_request.platforms == ["cpu"]
    result = build(build_request)
    assert "by IREE (dynamic)" in result.profiles and "the weights are stored twice" in result.profiles
    module = sum(f.stat().st_size for f in (result.path / "executables").iterdir())
    weights = sum(f.stat().st_size for f in (result.path / "weights").iterdir())
    assert module > weights  # as the summary says: the module holds the weights as well
    m = json.loads((result.path / "manifest.json").read_text())
    assert m["metadata"]["build_key_parts"]["compiler_options"] == {
        "iree": {"flags": list(iree_backend.FLAGS), **iree_backend.versions()}}
    xla = build(config.validate(compose_cfg(overrides)))
    assert xla.key != result.key
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(tb.load(result.path)(x), model_reference(build_request, {"x": x}), rtol=1e-4, atol=1e-5)


def test_incompatible_iree_module_is_reported():
    from tripy_build import host
    from tripy_build.artifact.compat import incompatibility
    from tripy_build.artifact.manifest import IREE_FORMAT, ExecutableEntry

    def module(depends_on):
        return ExecutableEntry("executables/0.vmfb", IREE_FORMAT, "cpu", depends_on=depends_on)

    ok = dict(host.host_features(), **iree_backend.versions())
    assert incompatibility(module(ok)) is None
    assert "compiled by IREE 0.0.1" in incompatibility(module(dict(ok, **{"iree-base-compiler": "0.0.1"})))
    assert "features this host lacks (zz_feature)" in incompatibility(
        module(dict(ok, cpu_features=ok["cpu_features"] + " zz_feature")))
