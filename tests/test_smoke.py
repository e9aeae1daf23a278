"""The smoke set: a build, both loaders, a served request and generation, end to end.

It runs in the suite, and ``.ci/run`` runs it again in a second virtual environment on jax 0.11.2, the
version the GPU machines have (the suite itself runs on 0.12): every jaxlib internal the loaders call
(``tripy_build/jaxlib_api.py``) is exercised on both.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tripy_build as tb
from tripy_build import runtime
from tripy_build.serve.http import Server

GEGLU = ["model=geglu", "shapes=dynamic", "model.dim_in=16", "model.dim_out=8", "shapes.dims.batch=[1,4,8]"]
GPT2 = ["model=gpt2", "task=generate", "model.n_layer=2", "model.n_embd=32", "model.n_head=4", "model.vocab_size=96",
        "model.n_positions=64", "generate.max_length=32", "shapes.dims.batch=[1,1,2]", "shapes.dims.seq=[1,4,8]",
        "shapes.buckets.seq=[1,8]"]


def build(root: Path, overrides: list[str]) -> Path:
    r = subprocess.run([sys.executable, "-m", "tripy_build", *overrides, f"artifacts_dir={root}"], capture_output=True,
                       text=True, cwd=root, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    (artifact,) = folder.iterdir()
    return artifact


def verify(artifact: Path) -> None:
    """``verify``: every file's digest, every profile loaded, the self-test against the model's own outputs."""
    r = subprocess.run([sys.executable, "-m", "tripy_build", "verify", str(artifact)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("VERIFIED"), r.stdout[-3000:] + r.stderr[-2000:]


@pytest.fixture(scope="module")
def geglu(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("smoke-geglu"), GEGLU)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("smoke-gpt2"), GPT2)


def test_a_built_artifact_verifies_and_both_loaders_agree(geglu):
    verify(geglu)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)  # 3: padded to the 4 bucket
    full, free = tb.load(geglu, warmup="none"), runtime.load(geglu, warmup="none")
    want = np.asarray(full(x))
    np.testing.assert_array_equal(free(x), want)
    assert want.shape == (3, 8) and np.isfinite(want).all()
    with pytest.raises(tb.TripyBuildError, match="batch"):
        free(np.ones((9, 16), np.float32))  # beyond the declared max of 8


def test_a_served_request_is_answered_with_the_loaders_result(geglu):
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    want = np.asarray(tb.load(geglu, warmup="none")(x))
    with Server([geglu], port=0).start() as server:
        host, port = server.url.split("//")[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        conn.request("POST", "/v2/models/geglu/infer", body=json.dumps(body), headers={"content-type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        conn.close()
    assert response.status == 200, answer
    (out,) = answer["outputs"]
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(out["shape"]), want, rtol=1e-6, atol=1e-6)


def test_generation_with_both_loaders(gpt2):
    verify(gpt2)  # the prefill and decode entries' self-tests
    prompts = [[5, 17, 33], [2, 9]]
    full = tb.load(gpt2, warmup="none").generate(prompts, 6)
    free = runtime.load(gpt2, warmup="none").generate(prompts, 6)
    np.testing.assert_array_equal(full, free)
    assert full.shape == (2, 6) and ((0 <= full) & (full < 96)).all()
