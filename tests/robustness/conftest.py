"""Helpers for the robustness catalogue: running the command, and small models that misbehave."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import prestarted
import pytest

# Models that go wrong in the ways a user's model does; imported by the build from the test's directory.
BAD_MODELS = textwrap.dedent('''
    from dataclasses import dataclass
    import jax, jax.numpy as jnp, numpy as np

    @dataclass(frozen=True)
    class Base:
        width: int = 4
        def init(self, key):
            return {"w": jnp.ones((self.width, self.width))}
        def inputs(self):
            return {"x": ["batch", self.width]}
        def apply(self, params, x):
            return x @ params["w"]

    class RaisesWhileTracing(Base):
        def apply(self, params, x):
            raise ValueError("this layer is not implemented yet")

    class ReturnsNonArrays(Base):
        def apply(self, params, x):
            return {"logits": "not an array"}

    class EvaluatesTracedValue(Base):
        def apply(self, params, x):
            if float(x.sum()) > 0:
                return x
            return -x

    class WrongMatmul(Base):
        def apply(self, params, x):
            return x @ jnp.ones((self.width + 1, 2))

    class InitRaises(Base):
        def init(self, key):
            raise RuntimeError("cannot download the pretrained weights")

    class NoApply:
        def init(self, key):
            return {}
        def inputs(self):
            return {"x": ["batch", 4]}
''')


BAD_CLASSES = ("RaisesWhileTracing", "ReturnsNonArrays", "EvaluatesTracedValue", "WrongMatmul", "InitRaises",
               "NoApply")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with ``badmodels.py`` and ``conf/model/<Class>.yaml`` for each of its models."""
    (tmp_path / "badmodels.py").write_text(BAD_MODELS)
    (tmp_path / "conf" / "model").mkdir(parents=True)
    for name in BAD_CLASSES:
        (tmp_path / "conf" / "model" / f"{name}.yaml").write_text(f"_target_: badmodels.{name}\nname: bad\n")
    return tmp_path


def run_cli(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(cwd), "TRIPY_BUILD_NO_MEMO": "1"}
    return prestarted.run_cli(*args, cwd=cwd, env=env, timeout=timeout)
