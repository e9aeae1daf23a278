"""``python -m tripy_build`` for the tests, forked from a process that has imported what the command imports.

The suite runs the command about 200 times; each run spent ~2 of its seconds importing jax, Hydra and the
package before it read its arguments. Here one server process per test worker imports them once, and every run
is a ``fork`` of it: a new process, with the test's working directory, environment, ``sys.path``, arguments and
standard streams (``/dev/null`` in, files out), that runs ``tripy_build/__main__.py`` as ``python -m`` does
(``runpy``, ``__main__``) and exits with the command's status after Python's own exit steps (non-daemon threads
joined, ``atexit``). Nothing had run in the server but imports: jax has started no backend, and no Python thread
runs (checked: a server with a second one is not used; numpy's and scipy's OpenBLAS pools are native threads their
fork handlers remake), so every run compiles, caches and writes as a fresh process would. What a fork shares with
its server is the hash seed: builds whose bytes are compared across processes run as plain processes.
``spawn_cli`` starts a run without waiting for it (a test that kills a build partway), the server busy with it
until it has ended.

A run whose environment would change what an import already read runs as a plain subprocess instead: a
variable in ``READ_AT_IMPORT`` (``JAX_``, ``XLA_``, ``PYTHON`` but ``PYTHONPATH``, ...) other than the server's,
a ``PYTHONPATH`` holding another copy of the package, a call made while another is in flight (from a test's
thread), or a server that could not start.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# what a build imports (python -X importtime -m tripy_build): the package's modules import jax, Hydra and numpy
PRELOAD = ("tripy_build", "tripy_build.cli.main", "tripy_build.cli.app", "tripy_build.builder.pipeline",
           "tripy_build.builder.memo", "tripy_build.compiler.pipeline", "tripy_build.artifact.write",
           "tripy_build.artifact.read", "tripy_build.runtime.runtime", "tripy_build.models", "hydra._internal.utils",
           "scipy.linalg")
READ_AT_IMPORT = ("JAX_", "XLA_", "TF_", "PYTHON", "LD_", "CUDA", "NVIDIA", "OMP_", "MKL_", "OPENBLAS_")


class _Server:
    """One forking server (this worker's), started on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.failed = False

    def start(self) -> bool:
        if self.proc is not None and self.proc.poll() is None:
            return True
        if self.failed:
            return False
        self.env = dict(os.environ)
        # unbuffered: Spawned.poll selects on the replies' pipe, which a buffered reader could have emptied ahead
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=tempfile.gettempdir(), env=self.env, bufsize=0)
        ready = self.proc.stdout.readline()
        if json.loads(ready or b'{"ready": false}').get("ready") is not True:
            self.proc.kill()
            self.failed, self.proc = True, None
            return False
        return True

    def forkable(self, env: dict[str, str]) -> bool:
        keys = {k for k in env.keys() | self.env.keys() if k.startswith(READ_AT_IMPORT) and k != "PYTHONPATH"}
        if any(env.get(k) != self.env.get(k) for k in keys):
            return False
        return not any((Path(p) / "tripy_build").exists() for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)

    def claim(self, env: dict[str, str]) -> bool:
        """Whether a run in ``env`` can be forked now: the lock taken (the caller releases it when the run has
        ended), the server started and ``env`` forkable; else nothing held."""
        if not self.lock.acquire(blocking=False):
            return False
        if self.start() and self.forkable(env):
            return True
        self.lock.release()
        return False

    def fork(self, args: list[str], cwd: Path, env: dict[str, str], out: Path, err: Path) -> int:
        """Start a forked run, its output to ``out`` and ``err`` (the same path: together); its pid."""
        request = {"args": args, "cwd": str(Path(cwd).absolute()), "env": env, "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["pid"]

    def returncode(self, args: list[str]) -> int:
        """The status of the forked run in flight, waiting for it to end."""
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the forking server of tests/prestarted.py died running {args}")
        return json.loads(line)["returncode"]

    def run(self, args: list[str], cwd: Path, env: dict[str, str], timeout: float, merged: bool
            ) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "stdout"
            err = out if merged else Path(tmp) / "stderr"
            pid = self.fork(args, cwd, env, out, err)
            killed = threading.Event()
            killer = threading.Timer(timeout, lambda: (killed.set(), os.kill(pid, 9)))
            killer.start()
            try:
                code = self.returncode(args)
            finally:
                killer.cancel()
            argv = [sys.executable, "-m", "tripy_build", *args]
            stdout = out.read_text(errors="replace")
            stderr = None if merged else err.read_text(errors="replace")
            if killed.is_set():
                raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
            return subprocess.CompletedProcess(argv, code, stdout, stderr)


_server = _Server()


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300,
            stderr_to_stdout: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", "tripy_build", *args], cwd=cwd, env=env, stdout=PIPE, stderr=PIPE
    (``stderr_to_stdout``: STDOUT), text=True, timeout=timeout)``, the process forked from this worker's server where
    it can be (module docstring). ``env`` is the whole environment (None: this process's)."""
    env = dict(os.environ if env is None else env)
    if _server.claim(env):
        try:
            return _server.run(list(args), cwd, env, timeout, stderr_to_stdout)
        finally:
            _server.lock.release()
    return subprocess.run([sys.executable, "-m", "tripy_build", *args], cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE, text=True,
                          timeout=timeout, env=env)


class Spawned:
    """A run of the command in flight (``spawn_cli``), forked or a plain subprocess: ``pid``, ``poll``, ``kill`` and
    ``wait`` as a ``Popen``'s, and ``output()``: its stdout and stderr together, as far as written."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self._out = Path(self._tmp.name) / "output"
        self._args, self.returncode = list(args), None
        self._forked = _server.claim(env)
        if self._forked:  # the lock is held until the run has ended (wait)
            try:
                self.pid = _server.fork(self._args, cwd, env, self._out, self._out)
            except BaseException:
                _server.lock.release()
                raise
        else:
            with open(self._out, "wb") as out:
                self._popen = subprocess.Popen([sys.executable, "-m", "tripy_build", *args], cwd=cwd, env=env,
                                               stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
            self.pid = self._popen.pid

    def output(self) -> str:
        return self._out.read_text(errors="replace") if self._out.exists() else ""

    def poll(self) -> int | None:
        if self.returncode is None:
            if not self._forked:
                self.returncode = self._popen.poll()
            elif select.select([_server.proc.stdout], [], [], 0)[0]:
                self._ended(_server.returncode(self._args))
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self._ended(_server.returncode(self._args) if self._forked else self._popen.wait())
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:  # it ended meanwhile; wait reads its status
                pass

    def _ended(self, code: int) -> None:
        self.returncode = code
        if self._forked:
            _server.lock.release()

    def __del__(self) -> None:
        if self.returncode is None:  # never left running: the server answers one run at a time
            self.kill()
            self.wait()
        self._tmp.cleanup()


def spawn_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Spawned:
    """``python -m tripy_build ARGS`` started, not waited for (``run_cli``'s process: forked where it can be)."""
    return Spawned(list(args), cwd, dict(os.environ if env is None else env))


# --- the server ------------------------------------------------------------------------------------------------


def _child(request: dict, added: dict[str, str], base_path: list[str]) -> None:
    """In the forked process: become ``python -m tripy_build ARGS`` and exit as it would. Never returns."""
    import atexit
    import importlib
    import runpy
    import traceback

    code = 1
    try:
        streams = [(0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT)]
        if request["stderr"] != request["stdout"]:
            streams.append((2, request["stderr"], os.O_WRONLY | os.O_CREAT))
        for fd, path, flags in streams:
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        if request["stderr"] == request["stdout"]:  # one file, one offset: interleaved as through one pipe
            os.dup2(1, 2)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for key, value in added.items():  # what the preloaded imports set (as they would at this process's start)
            os.environ.setdefault(key, value)
        extra = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *extra, *base_path]
        importlib.invalidate_caches()
        sys.argv = ["-m", *request["args"]]
        runpy.run_module("tripy_build", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 (an uncaught error ends the process as the interpreter ends it: status 1)
        traceback.print_exc()
    finally:
        try:
            threading._shutdown()  # as the interpreter's exit: join non-daemon threads, then atexit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve() -> None:
    import importlib
    import warnings

    own = sys.path.pop(0)  # this file's directory: the tests' modules are no part of the command's path
    before = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    added = {k: v for k, v in os.environ.items() if k not in before}
    zygote_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path if p not in zygote_path and p != own]
    reply = os.fdopen(os.dup(1), "wb", buffering=0)
    requests = os.fdopen(os.dup(0), "rb")
    # numpy's and scipy's OpenBLAS start their pools (native threads, remade in a forked child by their own
    # pthread_atfork handlers); a Python thread would be copied mid-step
    threads = [t.name for t in threading.enumerate()]
    reply.write(json.dumps({"ready": threads == ["MainThread"], "threads": threads}).encode() + b"\n")
    if threads != ["MainThread"]:
        return
    warnings.filterwarnings("ignore", "This process .* is multi-threaded, use of fork", DeprecationWarning)
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            reply.close()
            requests.close()
            _child(request, added, base_path)
        reply.write(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


if __name__ == "__main__":
    _serve()
