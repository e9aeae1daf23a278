"""Every shell command in the README runs as written.

The ```bash blocks are run in order as one script (so ``ART=...`` carries on to the lines after it),
in a scratch directory with this venv's ``bin`` first on ``PATH``. Only the lines that set up the venv
this test already runs in are left out, by a pattern with its reason; a line that takes too long at the
README's sizes runs with smaller ones (``SMALLER``: overrides appended, with the reason); any other
line runs as written, so a new README command is tested by default.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SKIP = {
    r"^\$\(scripts/find-python\) -m venv ": "creates the venv: .ci/run runs the README's test command on a fresh checkout",
    r"^source \.venv/bin/activate": "this test already runs with the venv's bin first on PATH",
    r"^pip install ": "this venv has the extras installed",
}

# pattern -> (arguments appended, why): the same command at a size the suite can afford
SMALLER = {
    r"model=transformer": ("model.d_model=16 model.heads=2 model.d_ff=32 shapes.dims.batch=[1,2,4]",
                           "49 profiles of a 256-wide block: ~40 s"),
    r"^python -m tripy_build -m ": ("model.dim_in=16 shapes.dims.batch=[1,2,4] artifacts_dir=sweep-artifacts",
                                    "8 builds at full width: ~40 s (kept apart: $ART is the newest full-size geglu)"),
    r"model=(bert|hf) params.checkpoint": ("shapes.dims.batch=[1,1,2] shapes.dims.seq=[1,16,32]",
                                           "50 profiles of a tiny BERT up to (16, 512): ~20 s"),
    r"model=gpt2 task=generate": ("shapes.dims.batch=[1,1,2] shapes.dims.seq=[1,8,16]",
                                  "36 profiles of a tiny GPT-2 (prompt chunks up to 128, batch up to 8): ~40 s"),
    r"tripy_build bench ": ("--stream 20 --shapes 1 --cold-rounds 1 --budget 0.05", "200 calls, 8 shapes: ~30 s"),
}


def smaller(line: str) -> str:
    """``line`` with the arguments ``SMALLER`` appends for it, before its comment."""
    for pattern, (extra, _) in SMALLER.items():
        if re.search(pattern, line):
            command, *comment = re.split(r"(\s+#\s)", line, maxsplit=1)
            return f"{command} {extra}{''.join(comment)}"
    return line


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_readme_shell_commands_run_as_written(tmp_path):
    commands = readme_commands()
    run, skipped = [], []
    for line in commands:
        reason = next((why for pattern, why in SKIP.items() if re.search(pattern, line)), None)
        (skipped if reason else run).append(line if reason else smaller(line))
    assert len(run) >= 10, run  # the README's commands did not all get skipped
    assert all(any(re.search(p, line) for line in run) for p in SMALLER), "a SMALLER pattern matches no command"
    (tmp_path / "examples").symlink_to(REPO / "examples")
    script = "set -euo pipefail\n" + "\n".join(f"echo '>>> {i}'\n{line}" for i, line in enumerate(run))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": ""}
    # its own process group, output to files: a command that leaves a process behind (a server not stopped) is
    # named, not waited on
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, stdout=out, stderr=err, text=True, env=env,
                                start_new_session=True)
        try:
            proc.wait(timeout=600)
            left = _group_alive(proc.pid)
        finally:
            _kill_group(proc.pid)
    stdout, stderr = (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()
    done = re.findall(r">>> (\d+)", stdout)
    failed_at = run[int(done[-1])] if done else "(before the first command)"
    # a command that fails first: the script stops there, and may leave a process the next command would stop
    assert proc.returncode == 0, f"README command failed: {failed_at}\n{stdout[-2000:]}\n{stderr[-3000:]}"
    assert not left, f"README commands left processes running: {left}"
    assert len(done) == len(run)
    assert any((tmp_path / "artifacts" / m).is_dir() for m in ("geglu", "nnx_mlp", "eqx_mlp"))
    assert (tmp_path / "generated" / "program.mlir").is_file()  # inspect --dump wrote the StableHLO


def _group_alive(pgid: int) -> list[str]:
    """The command lines of the processes still in process group ``pgid``."""
    out = subprocess.run(["ps", "-eo", "pgid=,args="], capture_output=True, text=True).stdout
    return [line.split(None, 1)[1] for line in out.splitlines() if line.split(None, 1)[0] == str(pgid)]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
