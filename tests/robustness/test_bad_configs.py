"""Bad configs: each ends in a short error naming the key (or the model's line) and what is accepted,
exit status 2, no traceback, nothing written, and nothing traced when the config alone is wrong.

``{tmp}`` in an override is the test's directory; ``SETUP`` prepares what a case needs there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .conftest import run_cli

SMALL = ["model.dim_in=8", "model.dim_out=8", "shapes.dims.batch=[1,2,4]"]
BAD = ["--config-dir", "{tmp}/conf"]

# (id, overrides, what the error must say, whether the model may be traced before the error)
CASES = [
    # --- types, ranges and names the schema knows
    ("unknown model key", ["model.dim_inn=3"], "dim_inn", False),
    ("level not an int", ["optimization_level=abc"], "optimization_level", False),
    ("level out of range", ["optimization_level=9"], "optimization_level", False),
    ("level negative", ["optimization_level=-1"], "optimization_level", False),
    ("unknown model option", ["model=foo"], "model=foo: no such option in config group 'model' (options: ", False),
    ("unknown shapes option", ["shapes=foo"], "shapes=foo: no such option", False),
    ("unknown precision option", ["precision=float64"], "precision=float64: no such option", False),
    # --- a typo gets the closest valid name
    ("misspelt key", ["optimisation_level=0"], "Did you mean `optimization_level`?", False),
    ("misspelt key, added", ["+optimisation_level=0"], "Did you mean `optimization_level`?", False),
    ("misspelt dim", ["shapes.dims.btach=[1,2,4]"], "Did you mean `shapes.dims.batch`?", False),
    ("misspelt model setting", ["model.dimin=3"], "Did you mean `model.dim_in`?", False),
    ("misspelt model option", ["model=gelgu"], "Did you mean `model=geglu`?", False),
    ("misspelt shapes option", ["shapes=dinamic"], "Did you mean `shapes=dynamic`?", False),
    ("misspelt precision option", ["precision=bf16"], "Did you mean `precision=bfloat16`?", False),
    ("misspelt precision dtype", ["precision.dtype=bf16"], "Did you mean `precision.dtype=bfloat16`?", False),
    ("level a word", ["optimization_level=fast"], "optimization_level=fast: Value 'fast' of type 'str' could not be "
                                                  "converted to Integer. optimization_level: 0..5", False),
    ("padding for an undeclared dim without +", ["model=transformer", "model.d_model=8", "model.heads=2",
                                                 "model.padding.height=rows"], "`+model.padding.height=rows`", False),
    ("override that does not parse", ["model.dim_in=[1"], "model.dim_in=[1: cannot parse it", False),
    ("constructor refuses its settings", ["model=transformer", "model.d_model=8", "model.heads=3"],
     "refused its settings (model.d_model=8, model.heads=3): d_model (8) must be divisible by heads (3)", False),
    ("a sweep with a misspelt option", ["-m", "model=gelgu,mlp"], "Did you mean `model=geglu`?", False),
    ("missing value", ["shapes.name=???"], "shapes.name", False),
    ("range not ordered", ["shapes.dims.batch=[8,4,2]"], "shapes.dims.batch", False),
    ("opt above max", ["shapes.dims.batch=[1,8,4]"], "shapes.dims.batch", False),
    ("range of two", ["shapes.dims.batch=[1,2]"], "shapes.dims.batch", False),
    ("size zero", ["shapes.dims.batch=0"], "shapes.dims.batch", False),
    ("negative model dim", ["model.dim_in=-4"], "model.dim_in", False),
    ("added unknown key", ["+new.key=1"], "new.key", False),
    ("added unknown model key", ["+model.extra=1"], "model.extra", False),
    ("unknown backend", ["backend=tpu"], "backend", False),
    ("unknown backend in a list", ["backend=[cpu,tpu]"], "backend", False),
    ("iree in a platform list", ["backend=[cpu,iree]"], "backend", False),
    ("empty backend list", ["backend=[]"], "backend", False),
    ("unknown cpu target", ["target.cpu=pentium"], "target.cpu", False),
    ("added target key", ["+target.gpu=sm90"], "target.gpu", False),
    ("precision dtype", ["precision.dtype=int8"], "precision.dtype", False),
    ("negative error budget", ["precision.max_error=-1"], "precision.max_error", False),
    ("budget not a number", ["precision.max_error=abc"], "precision.max_error", False),
    ("seed not an int", ["params.seed=abc"], "params.seed", False),
    ("weights stored an unknown way", ["weights=packed"], "weights: 'packed' is not a way to store weights", False),
    ("force not a bool", ["force=maybe"], "force", False),
    ("unknown bucket policy", ["shapes.buckets.batch=pow3"], "shapes.buckets.batch", False),
    ("bucket out of range", ["shapes.buckets.batch=[0,8]"], "shapes.buckets.batch", False),
    ("buckets for an unknown dim", ["+shapes.buckets.nodim=pow2"], "shapes.buckets.nodim", False),
    ("buckets for a static dim", ["shapes=static", "shapes.dims.batch=4", "+shapes.buckets.batch=pow2"],
     "shapes.buckets.batch", False),
    ("profile budget zero", ["shapes.max_profiles=0"], "shapes.max_profiles", False),
    ("over the profile budget", ["model=transformer", "shapes.max_profiles=10"],
     "exceed the budget of 10 executables (buckets per dim: 'batch': 7, 'seq': 9; profiles are their product, plus "
     "opt). Raise the budget (shapes.max_profiles=N", False),
    ("unknown padding kind", ["model.padding.batch=columns"], "model.padding.batch", False),
    ("padding for a dim the model lacks", ["+model.padding.seq=mask"], "model.padding", False),
    ("padding not a mapping", ["model.padding=rows"], "model.padding", False),
    ("unknown dtype of a config model's input", [*BAD, "model=RaisesWhileTracing", "+model.input_dtypes.x=float99"],
     "input_dtypes", False),
    # --- contradictions between the model and the shapes
    ("model dim the shapes lack", ["model=transformer", "~shapes.dims.seq", "~shapes.buckets.seq"], "shapes.dims.seq", False),
    # --- the model itself
    ("unknown _target_", ["model._target_=nowhere.Model"], "cannot import 'nowhere.Model'", False),
    ("_target_ without apply", [*BAD, "model=NoApply"], "has no apply()", False),
    ("model raises while tracing", [*BAD, "model=RaisesWhileTracing"],
     "ValueError: this layer is not implemented yet", True),
    ("model returns non-arrays", [*BAD, "model=ReturnsNonArrays"],
     "must return one or more arrays", True),
    ("model evaluates a traced value", [*BAD, "model=EvaluatesTracedValue"],
     "Cannot evaluate a tensor while compiling", True),
    ("shape error inside the model", [*BAD, "model=WrongMatmul"],
     "badmodels.py", True),
    ("init raises", [*BAD, "model=InitRaises"], "cannot download the pretrained", True),
    # --- params
    ("missing checkpoint", ["params.checkpoint={tmp}/nothing"],
     "does not exist; pass a directory written by Hugging Face's save_pretrained", False),
    ("checkpoint of another model", ["params.checkpoint={tmp}/ckpt_other"], "has no leaf params['proj']", False),
    ("checkpoint of another width", ["params.checkpoint={tmp}/ckpt_wide"], "but the model needs shape", False),
    ("truncated checkpoint", ["params.checkpoint={tmp}/ckpt_truncated"], "params.checkpoint", False),
    # --- where it goes
    ("artifacts_dir under a file", ["artifacts_dir={tmp}/afile/arts"], "cannot write an artifact under", True),
]


def _orbax(path: Path, tree) -> None:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path.absolute(), tree)
        ckpt.wait_until_finished()


def _setup(case_id: str, tmp: Path) -> None:
    if case_id == "checkpoint of another model":
        _orbax(tmp / "ckpt_other", {"layers": [{"weight": np.ones((8, 8), np.float32)}]})
    elif case_id == "checkpoint of another width":
        _orbax(tmp / "ckpt_wide", {"proj": {"weight": np.ones((16, 9), np.float32), "bias": np.ones(16, np.float32)}})
    elif case_id == "truncated checkpoint":
        _orbax(tmp / "ckpt_truncated", {"proj": {"weight": np.ones((16, 8), np.float32), "bias": np.ones(16, np.float32)}})
        for f in (tmp / "ckpt_truncated").rglob("*"):
            if f.is_file() and f.stat().st_size > 64:
                f.write_bytes(f.read_bytes()[:32])
    elif case_id == "artifacts_dir under a file":
        (tmp / "afile").write_text("a file, not a directory")


@pytest.mark.parametrize("overrides,needle,traces", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config(overrides, needle, traces, workdir, request):
    _setup(request.node.callspec.id, workdir)
    arts = workdir / "arts"
    args = [o.replace("{tmp}", str(workdir)) for o in overrides]
    if not any(a.startswith("artifacts_dir=") for a in args):
        args.append(f"artifacts_dir={arts}")
    if not any(a.startswith(("model=", "--config-dir")) for a in args):
        args = [*(s for s in SMALL if not any(a.startswith(s.split("=")[0].lstrip("~")) for a in args)), *args]
    before = {p for p in workdir.rglob("*") if p != arts and arts not in p.parents}
    proc = run_cli(*args, cwd=workdir)
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, err[-2000:])  # our ConfigError/TraceError/ArtifactError
    assert "Traceback" not in err, err[-3000:]
    assert needle in err, err[-2000:]
    assert len(err.strip().splitlines()) <= 15, err
    if not traces:  # the config alone is wrong: one line, and the model was never traced
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
        assert "trace+export" not in proc.stdout + err
    after = {p for p in workdir.rglob("*") if p != arts and arts not in p.parents and "__pycache__" not in p.parts}
    assert after == {p for p in before if "__pycache__" not in p.parts}, sorted(after ^ before)  # no outputs/, multirun/
    assert not arts.exists() or not any(arts.rglob("manifest.json"))
    assert not any(workdir.rglob(".*.tmp-*"))


def test_the_catalogue_is_large_enough():
    assert len(CASES) >= 30


def test_hydra_full_error_shows_hydras_own_traceback(workdir):
    """``HYDRA_FULL_ERROR=1`` still gives the whole traceback for a config error, as Hydra documents."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "tripy_build", "optimisation_level=0"], cwd=workdir,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HYDRA_FULL_ERROR": "1", "TRIPY_BUILD_NO_MEMO": "1"})
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ConfigCompositionException" in proc.stderr
