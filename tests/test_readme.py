"""Every shell command in the README runs as written.

The ```bash blocks are run in order as one script (so ``ART=...`` carries on to the lines after it),
in a scratch directory with this venv's ``bin`` first on ``PATH``. Lines that are too slow for the
suite, or that set up the venv this test already runs in, are left out by a pattern with its reason;
any other line runs, so a new README command is tested by default.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SKIP = {
    r"^python3 -m venv ": "creates the venv: .ci/run runs the README's test command on a fresh checkout",
    r"^source \.venv/bin/activate": "this test already runs with the venv's bin first on PATH",
    r"^pip install ": "this venv has the extras installed",
    r"model=transformer": "a ~20 s build; the transformer CLI build is in test_cli",
    r"^python -m tripy_build -m ": "an 8-build sweep; test_cli runs a sweep",
    r"--rebuild": "rebuilds the artifact; verify --rebuild is tested in test_reproducible",
    r"tripy_build\.bench ": "a benchmark of tens of seconds; test_cli runs it through bench=true",
}


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_readme_shell_commands_run_as_written(tmp_path):
    commands = readme_commands()
    run, skipped = [], []
    for line in commands:
        reason = next((why for pattern, why in SKIP.items() if re.search(pattern, line)), None)
        (skipped if reason else run).append(line)
    assert len(run) >= 10, run  # the README's commands did not all get skipped
    (tmp_path / "examples").symlink_to(REPO / "examples")
    script = "set -euo pipefail\n" + "\n".join(f"echo '>>> {i}'\n{line}" for i, line in enumerate(run))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": ""}
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    done = re.findall(r">>> (\d+)", proc.stdout)
    failed_at = run[int(done[-1])] if done else "(before the first command)"
    assert proc.returncode == 0, f"README command failed: {failed_at}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert len(done) == len(run)
    assert any((tmp_path / "artifacts" / m).is_dir() for m in ("geglu", "nnx_mlp", "eqx_mlp"))
    assert (tmp_path / "generated" / "program.mlir").is_file()  # inspect --dump wrote the StableHLO
