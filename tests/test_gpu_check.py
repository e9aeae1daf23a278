"""``scripts/gpu_check.sh --cpu``: the GPU check run on the CPU, so that the script a GPU machine runs cannot rot.

Two of its models, which between them take every path of the script: a Hugging Face checkpoint compared with
PyTorch (a call, served over HTTP; a generation), and the GEGLU built for an H100 without one; the zoo's GEGLU and
transformer block would run the same paths again (each is built and checked elsewhere in the suite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_check_runs_on_the_cpu(tmp_path):
    # --no-install: this venv is the suite's, in use by the other worker (gpu_check.sh would reinstall the project)
    r = subprocess.run([str(REPO / "scripts" / "gpu_check.sh"), "--no-install", "--cpu", "--models", "bert,gpt2",
                        "--out", str(tmp_path / "check")],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "0 failed" in r.stdout and "built, and refused on this CPU" in r.stdout
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    assert {(row["model"], row["loader"]) for row in report} == {
        (m, loader) for m in ("bert", "gpt2") for loader in ("tb", "runtime")} | {("bert", "serve")}
    for row in report:
        assert row["error_vs_cpu"] == 0.0  # the runtime loader and the server give what tb.load gives, to the bit
        assert row["cold_s"] > 0 and row["opt_ms"] > 0
        assert row["serve_loader"] == "runtime" if row["loader"] == "serve" else row["max_ms"] > 0
    bert = next(row for row in report if row["model"] == "bert")
    assert bert["error_vs_torch"] == "-" or float(bert["error_vs_torch"]) < 1e-4
    gpt2 = next(row for row in report if row["model"] == "gpt2")
    assert gpt2["error_vs_torch"] in ("-", "0 tokens differ")
