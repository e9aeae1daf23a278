"""Reproducible builds, the build cache and ``verify``, end to end through the build command.

Every build runs ``python -m tripy_build`` in a fresh process, as a user would, with its own
``XDG_CACHE_HOME`` (the invocation memo lives there) and its own working directory (Hydra writes
``outputs/`` there). Builds that many tests read are made once per module, several at a time.
Tests that modify an artifact work on a copy.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import prestarted
import pytest

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
WORKERS = 2  # concurrent build processes in a batch (builds are mostly single-threaded)
TIMEOUT = 300

SMALL = {
    "geglu": ["model=geglu", "model.dim_in=16", "model.dim_out=8", "shapes=dynamic"],
    "mlp": ["model=mlp", "model.dim_in=16", "model.hidden=32", "model.dim_out=8", "model.layers=2", "shapes=dynamic"],
    # 2 x 2 = 4 profiles (batch 1 2, seq 4 8; pow2 gave 3 x 4 = 12): two dims padded by their own kinds (batch
    # rows, seq mask); the self-test's min (1, 1) and padded (2, 5) cases run padded
    "transformer": ["model=transformer", "model.d_model=16", "model.heads=2", "model.d_ff=32", "shapes=dynamic",
                    "shapes.dims.batch=[1,2,2]", "shapes.dims.seq=[1,4,8]", "shapes.buckets.seq=[4,8]"],
}
BUILD_STAGES = ("trace+export", "profile(s)")
KEY_RE = re.compile(r"^[0-9a-f]{16}$")


# ---------------------------------------------------------------------------------------- helpers


def env_with(xdg: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRIPY_BUILD_NO_MEMO", "PYTHONPATH")}
    env["XDG_CACHE_HOME"] = str(xdg)
    env.update(extra)
    return env


@dataclass
class Run:
    args: list[str]
    returncode: int
    output: str  # stdout and stderr, interleaved

    def ok(self) -> "Run":
        assert self.returncode == 0, f"{' '.join(self.args)} exited {self.returncode}:\n{self.output[-4000:]}"
        return self


def run(argv: list[str], *, cwd: Path, xdg: Path, env: dict[str, str] | None = None, timeout: int = TIMEOUT,
        fork: bool = True) -> Run:
    """``argv`` in a fresh process; a ``python -m tripy_build`` one forked from a process that has imported the
    package (``prestarted.py``) unless ``fork`` is False (builds whose bytes are compared across processes: a
    forked process has its server's hash seed)."""
    cwd.mkdir(parents=True, exist_ok=True)
    whole = env_with(xdg, **(env or {}))
    if fork and argv[:3] == [PY, "-m", "tripy_build"]:
        proc = prestarted.run_cli(*argv[3:], cwd=cwd, env=whole, timeout=timeout, stderr_to_stdout=True)
    else:
        proc = subprocess.run(argv, cwd=cwd, env=whole, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
    return Run(argv, proc.returncode, proc.stdout)


@dataclass
class Site:
    """Where one build sequence runs: an artifacts dir, a memo (XDG cache) and a working dir."""

    root: Path

    def __post_init__(self):
        for d in (self.arts, self.xdg, self.cwd):
            d.mkdir(parents=True, exist_ok=True)

    @property
    def arts(self) -> Path:
        return self.root / "arts"

    @property
    def xdg(self) -> Path:
        return self.root / "xdg"

    @property
    def cwd(self) -> Path:
        return self.root / "work"

    def build(self, *overrides: str, env: dict[str, str] | None = None, cwd: Path | None = None,
              fork: bool = True) -> Run:
        return run([PY, "-m", "tripy_build", *overrides, f"artifacts_dir={self.arts}"], cwd=cwd or self.cwd,
                   xdg=self.xdg, env=env, fork=fork)


def artifact_dirs(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.iterdir() if not p.name.startswith(".")) if model_dir.is_dir() else []


def hidden_entries(model_dir: Path) -> list[str]:
    return sorted(p.name for p in model_dir.iterdir() if p.name.startswith(".")) if model_dir.is_dir() else []


def only_artifact(model_dir: Path) -> Path:
    dirs = artifact_dirs(model_dir)
    assert len(dirs) == 1, f"expected one artifact under {model_dir}, found {[d.name for d in dirs]}"
    assert KEY_RE.match(dirs[0].name), dirs[0].name
    return dirs[0]


def reported_path(r: Run) -> Path:
    """The artifact path the build command printed (``artifact: PATH``)."""
    m = re.search(r"^artifact: (\S+)", r.output, re.M)
    assert m, f"no 'artifact: PATH' line in:\n{r.output[-3000:]}"
    return Path(m.group(1))


def verify(path: Path, *extra: str, xdg: Path, cwd: Path) -> Run:
    return run([PY, "-m", "tripy_build", "verify", str(path), *extra], cwd=cwd, xdg=xdg)


def last_line(r: Run) -> str:
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def assert_verified(r: Run) -> None:
    assert r.returncode == 0 and last_line(r).startswith("VERIFIED"), f"verify failed:\n{r.output[-4000:]}"


def in_parallel(jobs, workers: int = WORKERS):
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(j) for j in jobs]
        return [f.result() for f in futures]


def manifest(path: Path) -> dict:
    import json

    return json.loads((path / "manifest.json").read_bytes())


def selftest_files(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted((path / "selftest").rglob("*")) if p.is_file()}


def stat_of(path: Path) -> dict[str, tuple[int, int]]:
    """Inode and mtime of the artifact dir and of the files a rewrite would replace."""
    out = {}
    for p in (path, path / "manifest.json", path / "index.json", path / "program.jaxexport"):
        st = p.stat()
        out[p.name] = (st.st_ino, st.st_mtime_ns)
    return out


def assert_cache_hit(r: Run, path: Path) -> None:
    r.ok()
    assert "cache hit" in r.output, f"expected a cache hit:\n{r.output[-3000:]}"
    assert str(path) in r.output, f"the cache hit does not name {path}:\n{r.output[-3000:]}"
    for stage in BUILD_STAGES:
        assert stage not in r.output, f"a cache hit ran the {stage!r} stage:\n{r.output[-3000:]}"


def assert_built(r: Run) -> None:
    r.ok()
    for stage in BUILD_STAGES:
        assert stage in r.output, f"expected a full build (stage {stage!r}):\n{r.output[-3000:]}"


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------ shared builds


@dataclass
class Built:
    site: Site
    overrides: list[str]
    run: Run
    cwd: Path | None = None

    @property
    def model(self) -> str:
        return next(o.split("=", 1)[1] for o in self.overrides if o.startswith("model="))

    @property
    def path(self) -> Path:
        return only_artifact(self.site.arts / self.model)

    def again(self, *extra: str, xdg: Path | None = None) -> Run:
        """The same command (same argv and working directory), with ``extra`` overrides appended."""
        argv = [PY, "-m", "tripy_build", *self.overrides, *extra, f"artifacts_dir={self.site.arts}"]
        return run(argv, cwd=self.cwd or self.site.cwd, xdg=xdg or self.site.xdg)


@pytest.fixture(scope="module")
def checkout2(tmp_path_factory) -> Path:
    """A second copy of the package (working tree, uncommitted changes included) at another path."""
    root = tmp_path_factory.mktemp("checkout2")
    shutil.copytree(REPO / "tripy_build", root / "tripy_build", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


@pytest.fixture(scope="module")
def builds(tmp_path_factory, checkout2) -> dict[str, Built]:
    """Independent builds, each in its own process, artifacts dir and memo, run a few at a time.

    ``<model>_a`` and ``<model>_b`` are the same config built twice; ``checkout2`` is geglu's config
    built by the second copy of the package from an unrelated working directory.
    """
    plan: dict[str, tuple[list[str], dict[str, str] | None, Path | None]] = {}
    for model in ("geglu", "mlp", "transformer"):
        for copy in ("a", "b"):
            plan[f"{model}_{copy}"] = (SMALL[model], None, None)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    plan["checkout2"] = (SMALL["geglu"], {"PYTHONPATH": str(checkout2)}, elsewhere)

    def job(name):
        overrides, env, cwd = plan[name]
        site = Site(tmp_path_factory.mktemp(name))
        return name, Built(site, overrides, site.build(*overrides, env=env, cwd=cwd, fork=False), cwd)

    return dict(in_parallel([lambda n=n: job(n) for n in plan]))


# ------------------------------------------------------------------------------ reproducibility


@pytest.mark.parametrize("model", ["geglu", "mlp", "transformer"])
def test_two_processes_build_identical_artifacts(builds, model):
    a, b = builds[f"{model}_a"], builds[f"{model}_b"]
    for built in (a, b):
        assert_built(built.run)
        assert reported_path(built.run) == built.path
    assert a.path.name == b.path.name, "the same config gave two different build keys"
    assert a.path != b.path
    assert (a.path / "manifest.json").read_bytes() == (b.path / "manifest.json").read_bytes()
    assert (a.path / "program.jaxexport").read_bytes() == (b.path / "program.jaxexport").read_bytes()
    sa, sb = selftest_files(a.path), selftest_files(b.path)
    assert sa, "the artifact has no self-test files"
    assert sorted(sa) == sorted(sb)
    for rel in sa:
        assert sa[rel] == sb[rel], f"{rel} differs between the two builds"
    ma, mb = manifest(a.path), manifest(b.path)
    assert ma["metadata"]["params"]["sha256"] == mb["metadata"]["params"]["sha256"]
    assert ma["metadata"]["build_key"].startswith(a.path.name)
    assert len(ma["executables"]) >= 1 and [c["name"] for c in ma["selftest"]] == ["min", "opt", "max", "padded"]


def test_second_checkout_at_another_path_builds_the_same_bytes(builds, checkout2, tmp_path):
    probe = run([PY, "-c", "import tripy_build; print(tripy_build.__file__)"], cwd=tmp_path / "probe",
                xdg=tmp_path / "xdg", env={"PYTHONPATH": str(checkout2)}).ok()
    imported = Path(probe.output.strip().splitlines()[-1]).resolve()
    assert checkout2.resolve() in imported.parents, f"tripy_build came from {imported}, not {checkout2}"

    first, second = builds["geglu_a"], builds["checkout2"]
    assert_built(second.run)
    assert second.path.name == first.path.name
    for name in ("manifest.json", "program.jaxexport"):
        assert (second.path / name).read_bytes() == (first.path / name).read_bytes(), f"{name} differs"
    assert selftest_files(second.path) == selftest_files(first.path)


# ---------------------------------------------------------------------------------- build cache


@pytest.mark.parametrize("memo", ["same memo", "fresh memo"])
def test_unchanged_build_is_a_cache_hit_that_rewrites_nothing(builds, memo, tmp_path):
    """The same command again: answered from the cache (with the first build's memo, or without one)."""
    built = builds["geglu_a"]
    path = built.path
    before, entries = stat_of(path), sorted(p.name for p in path.parent.iterdir())
    r = built.again(xdg=None if memo == "same memo" else tmp_path / "xdg")
    assert_cache_hit(r, path)
    assert stat_of(path) == before, "a cache hit rewrote the artifact"
    assert sorted(p.name for p in path.parent.iterdir()) == entries


def test_force_rebuilds_and_damaged_or_missing_artifacts_are_rebuilt(tmp_path):
    site = Site(tmp_path)
    first = site.build(*SMALL["geglu"])
    assert_built(first)
    path = only_artifact(site.arts / "geglu")
    original = {n: (path / n).read_bytes() for n in ("manifest.json", "program.jaxexport")}

    for attempt in range(2):  # force=true twice: a forced command must never be answered from a memo
        forced = site.build(*SMALL["geglu"], "force=true")
        assert_built(forced)
        assert "cache hit" not in forced.output
        assert only_artifact(site.arts / "geglu") == path, f"force=true changed the build key (attempt {attempt})"
        assert {n: (path / n).read_bytes() for n in original} == original
    assert_cache_hit(site.build(*SMALL["geglu"]), path)

    # A deleted artifact is rebuilt, not reported.
    shutil.rmtree(path)
    again = site.build(*SMALL["geglu"])
    assert_built(again)
    assert only_artifact(site.arts / "geglu") == path
    assert (path / "manifest.json").read_bytes() == original["manifest.json"]

    # A damaged artifact is not served from the cache: it is rebuilt, and the rebuild replaces it.
    flip_byte(path / "program.jaxexport")
    rebuilt = site.build(*SMALL["geglu"])
    assert_built(rebuilt)
    assert "cache hit" not in rebuilt.output
    assert (path / "program.jaxexport").read_bytes() == original["program.jaxexport"], (
        "the build rebuilt over a damaged artifact but left the damaged files in place")
    assert_verified(verify(path, xdg=site.xdg, cwd=site.cwd))
    assert hidden_entries(site.arts / "geglu") == []


def test_config_changes_change_the_build_key(builds, tmp_path):
    """Each variant gets its own directory; all share one memo and are built concurrently."""
    site = Site(tmp_path)
    variants = {
        "base": [],
        "optimization_level": ["optimization_level=2"],
        "seed": ["params.seed=1"],
        "shapes": ["shapes.dims.batch=[1,4,32]"],
        "XLA_FLAGS": [],  # the same command line in another environment
    }
    envs = {"XLA_FLAGS": {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}}
    runs = dict(in_parallel([lambda k=k, v=v: (k, site.build(*SMALL["geglu"], *v, env=envs.get(k)))
                             for k, v in variants.items()]))
    paths = {}
    for name, r in runs.items():
        assert_built(r)
        paths[name] = reported_path(r)
    assert len({p.name for p in paths.values()}) == len(variants), f"variants share a build key: {paths}"
    assert sorted(artifact_dirs(site.arts / "geglu")) == sorted(paths.values())
    assert paths["base"].name == builds["geglu_a"].path.name, "the key depends on the artifacts dir"
    assert manifest(paths["seed"])["metadata"]["params"]["sha256"] != manifest(paths["base"])["metadata"]["params"]["sha256"]
    assert manifest(paths["optimization_level"])["optimization_level"] == 2
    assert manifest(paths["XLA_FLAGS"])["toolchain"]["xla_flags"] == envs["XLA_FLAGS"]["XLA_FLAGS"]
    # The base command again is a hit on the base artifact, not on a variant's.
    assert_cache_hit(site.build(*SMALL["geglu"]), paths["base"])


def test_user_model_code_and_config_are_hashed_by_content(tmp_path):
    """A user's model package outside tripy_build: editing a comment in it, or its yaml, changes the key."""
    pkg = tmp_path / "src" / "mymodels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    src = {"geglu.py": (REPO / "tripy_build" / "models" / "geglu.py").read_text(),
           "_layers.py": (REPO / "tripy_build" / "models" / "_layers.py").read_text()}

    def write_sources(geglu_rev: int, layers_rev: int) -> None:  # same length: only the content changes
        (pkg / "geglu.py").write_text(src["geglu.py"] + f"# revision {geglu_rev}\n")
        (pkg / "_layers.py").write_text(src["_layers.py"] + f"# revision {layers_rev}\n")

    conf = tmp_path / "conf" / "model"
    conf.mkdir(parents=True)

    def write_yaml(dim_out: int) -> None:
        (conf / "ugeglu.yaml").write_text(f"_target_: mymodels.geglu.GEGLU\nname: ugeglu\ndim_in: 16\ndim_out: {dim_out}\n")

    site = Site(tmp_path / "site")
    env = {"PYTHONPATH": str(tmp_path / "src")}

    def build() -> Run:
        return site.build("--config-dir", str(tmp_path / "conf"), "model=ugeglu", "shapes=dynamic", env=env)

    write_sources(1, 1)
    write_yaml(8)
    r1 = build()
    assert_built(r1)
    p1 = reported_path(r1)
    code = manifest(p1)["metadata"]["build_key_parts"]["model_code"]
    assert set(code) == {"mymodels.geglu", "mymodels._layers"}, code

    write_sources(2, 1)  # a comment in the model's module
    r2 = build()
    assert_built(r2)
    p2 = reported_path(r2)
    assert p2.name != p1.name, "editing the model's source did not change the build key"

    write_sources(2, 2)  # a comment in a helper module the model imports
    r3 = build()
    assert_built(r3)
    p3 = reported_path(r3)
    assert p3.name not in (p1.name, p2.name), "editing the model's helper module did not change the build key"

    write_yaml(4)  # the model's yaml, same command line
    r4 = build()
    assert_built(r4)
    p4 = reported_path(r4)
    assert p4.name not in (p1.name, p2.name, p3.name), "editing the model's yaml did not change the build key"
    assert manifest(p4)["outputs"][0]["max"][-1] == 4

    write_sources(1, 1)  # everything back as it was: the first artifact again, by content
    write_yaml(8)
    assert_cache_hit(build(), p1)
    assert len(artifact_dirs(site.arts / "ugeglu")) == 4


def test_params_checkpoint_is_hashed_by_value(tmp_path):
    """Different params behind the same ``params.checkpoint`` path: a different key; the old ones back: a hit."""
    code = textwrap.dedent(f"""
        import jax
        from tripy_build.builder import params
        from tripy_build.models.geglu import GEGLU
        model = GEGLU(dim_in=16, dim_out=8)
        for seed in (1, 2):
            params.save({str(tmp_path)!r} + f"/v{{seed}}", jax.device_get(model.init(jax.random.PRNGKey(seed))))
    """)
    run([PY, "-c", code], cwd=tmp_path / "work", xdg=tmp_path / "xdg").ok()
    ckpt = tmp_path / "ckpt"
    site = Site(tmp_path / "site")

    def build_from(version: str) -> Run:
        shutil.rmtree(ckpt, ignore_errors=True)
        shutil.copytree(tmp_path / version, ckpt)
        return site.build(*SMALL["geglu"], f"params.checkpoint={ckpt}")

    r1 = build_from("v1")
    assert_built(r1)
    p1 = reported_path(r1)
    r2 = build_from("v2")
    assert_built(r2)
    p2 = reported_path(r2)
    assert p2.name != p1.name, "new params behind the same checkpoint path did not change the build key"
    assert manifest(p1)["metadata"]["params"]["sha256"] != manifest(p2)["metadata"]["params"]["sha256"]
    assert_cache_hit(build_from("v1"), p1)


# ---------------------------------------------------------------------- concurrency and crashes


def test_concurrent_builds_of_one_key_leave_one_artifact(tmp_path):
    site = Site(tmp_path)
    argv = [PY, "-m", "tripy_build", *SMALL["mlp"], "params.seed=7", f"artifacts_dir={site.arts}"]
    procs = [subprocess.Popen(argv, cwd=site.cwd, env=env_with(site.xdg), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]
    model_dir = site.arts / "mlp"
    path = only_artifact(model_dir)
    assert hidden_entries(model_dir) == [], "temporary directories were left behind"
    for out in outputs:
        assert str(path) in out
    assert_verified(verify(path, xdg=site.xdg, cwd=site.cwd))


# When to kill: after a log line appears, or once this process's temporary artifact dir exists
# (the write stage: files, fsync, rename), plus a delay. 13 points, at least one in every stage: each costs a
# build up to it (~4 s on the suite's loaded 2 cores), so a stage gets a second point only where its timing varies.
KILL_POINTS = [("start", 0.3), ("init params", 0.0), ("trace+export", 0.0), ("compile prep", 0.0),
               ("profile 4/", 0.0), ("prove padding", 0.0), ("self-test reference", 0.0), ("tmpdir", 0.0),
               ("tmpdir", 0.1), ("tmpdir", 0.4)]
SWEEP_KILL_POINTS = [("#0 :", 0.5), ("#1 :", 0.0), ("tmpdir", 0.0)]


def _kill_at(argv, site, model_dir, event, delay) -> tuple[bool, str]:
    """Run ``argv``, SIGKILL it at ``event`` + ``delay``; whether it was killed, and a line saying where."""
    assert argv[:3] == [PY, "-m", "tripy_build"], argv
    b = prestarted.spawn_cli(*argv[3:], cwd=site.cwd, env=env_with(site.xdg))  # forked: no seconds of imports first
    t0 = time.monotonic()
    fired = None
    while b.poll() is None and time.monotonic() - t0 < TIMEOUT:
        if event == "start":
            hit = True
        elif event == "tmpdir":
            hit = model_dir.is_dir() and any(f".tmp-{b.pid}@" in n for n in hidden_entries(model_dir))
        else:
            hit = event in b.output()
        if hit and fired is None:
            fired = time.monotonic()
        if fired is not None and time.monotonic() - fired >= delay:
            break
        time.sleep(0.005)
    finished = b.poll() is not None
    b.kill()
    b.wait()
    return not finished, f"{event}+{delay}s: {'finished' if finished else 'killed'} at {time.monotonic() - t0:.2f}s"


def _kill_during(argv, site, model_dir, event, delay) -> tuple[bool, str]:
    """``_kill_at``, again with half the delay while the build finished first (a fast machine outran it)."""
    lines = []
    for _ in range(4):
        killed, line = _kill_at(argv, site, model_dir, event, delay)
        lines.append(line)
        if killed or delay == 0:
            break
        delay /= 2
    return killed, "; ".join(lines)


def test_killed_builds_and_sweeps_leave_nothing_trusted_and_the_next_build_recovers(tmp_path):
    """10 SIGKILLs of a forced rebuild at every stage, 3 of a sweep: every artifact at a final path
    verifies after each, the next build succeeds, and no temporary is left behind."""
    site = Site(tmp_path)
    argv = [PY, "-m", "tripy_build", "model=mlp", "shapes=dynamic", "force=true", f"artifacts_dir={site.arts}"]
    sweep = [PY, "-m", "tripy_build", "-m", "model=mlp,geglu", "shapes=static", "force=true",
             f"artifacts_dir={site.arts}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    model_dir = site.arts / "mlp"
    log, checked, kills = [], set(), 0
    for run_argv, points in ((argv, KILL_POINTS), (sweep, SWEEP_KILL_POINTS)):
        for event, delay in points:
            killed, line = _kill_during(run_argv, site, model_dir, event, delay)
            kills += killed
            log.append(line)
            # Nothing at a final artifact path may be half-written: every artifact there verifies.
            for path in artifact_dirs(model_dir) + artifact_dirs(site.arts / "geglu"):
                stamp = (path, (path / "manifest.json").stat().st_mtime_ns)
                if stamp not in checked:
                    assert_verified(verify(path, xdg=site.xdg, cwd=site.cwd))
                    checked.add(stamp)
    print("\n".join(log))
    assert kills == len(KILL_POINTS) + len(SWEEP_KILL_POINTS) == 13, "\n".join(log)

    r = run(argv[:-2] + [f"artifacts_dir={site.arts}"], cwd=site.cwd, xdg=site.xdg).ok()
    path = reported_path(r)
    assert path in artifact_dirs(model_dir)
    # the sweep's next run too: a kill in it may have left a geglu temporary, which only a geglu build sees
    run([a for a in sweep if a != "force=true"], cwd=site.cwd, xdg=site.xdg).ok()
    for d in (model_dir, site.arts / "geglu"):
        assert not d.is_dir() or hidden_entries(d) == [], f"leftovers: {hidden_entries(d)}\n" + "\n".join(log)
    assert_verified(verify(path, xdg=site.xdg, cwd=site.cwd))


# ----------------------------------------------------------------------------------------- verify


TAMPERS = ["program.jaxexport", "executables/0.xla", "weights/prepared_0.npy", "selftest/max/output0.npy", "extra file",
           "extra file in executables/", "deleted selftest/min/input0.npy", "prep.jaxexport"]


def test_verify_catches_tampering(builds, tmp_path):
    source = builds["geglu_a"].path
    cases = []
    for i, tamper in enumerate(TAMPERS):
        copy = tmp_path / f"case{i}" / source.name
        shutil.copytree(source, copy)
        if tamper == "extra file":
            named = "extra.txt"
            (copy / named).write_text("not listed\n")
        elif tamper == "extra file in executables/":
            named = "executables/99.xla"
            (copy / named).write_bytes(b"\0" * 16)
        elif tamper.startswith("deleted "):
            named = tamper.split(" ", 1)[1]
            (copy / named).unlink()
        else:
            named = tamper
            flip_byte(copy / named, offset=-1 if named.endswith(".npy") else None)  # .npy: a data byte
        cases.append((tamper, named, copy))

    results = in_parallel([lambda c=c: verify(c[2], xdg=tmp_path / "xdg", cwd=tmp_path / "work") for c in cases])
    problems = []
    for (tamper, named, _), r in zip(cases, results):
        fails = [ln for ln in r.output.splitlines() if ln.startswith("FAIL")]
        if r.returncode == 0 or not last_line(r).startswith("FAILED") or not any(named in ln for ln in fails):
            problems.append(f"{tamper}: exit {r.returncode}, FAIL lines {fails}\n{r.output[-1500:]}")
    assert not problems, "\n\n".join(problems)


def test_verify_rebuild_reproduces_a_fresh_build(builds, tmp_path):
    path = builds["geglu_a"].path
    r = verify(path, "--rebuild", xdg=tmp_path / "xdg", cwd=tmp_path / "work")
    assert_verified(r)
    assert "PASS  rebuild: bytes manifest.json" in r.output, r.output[-3000:]
    assert "PASS  rebuild: bytes program.jaxexport" in r.output, r.output[-3000:]
    assert "PASS  rebuild: same build key" in r.output


def test_console_script_verify(builds, tmp_path):
    script = Path(PY).parent / "tripy-build"
    assert script.is_file(), f"no console script at {script}"
    r = run([str(script), "verify", str(builds["mlp_a"].path)], cwd=tmp_path / "work", xdg=tmp_path / "xdg")
    assert_verified(r)


def test_verify_artifact_saved_from_the_python_api(tmp_path):
    code = textwrap.dedent(f"""
        import numpy as np, jax, tripy_build as tb
        w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
        def f(x, w):
            return jax.nn.relu(x @ w)
        exe = tb.compile(f, args=[tb.InputInfo(((1, 2, 8), 4), "float32"), w])
        exe.save({str(tmp_path / "api_artifact")!r})
    """)
    run([PY, "-c", code], cwd=tmp_path / "work", xdg=tmp_path / "xdg").ok()
    path = tmp_path / "api_artifact"
    plain, rebuild = in_parallel([lambda: verify(path, xdg=tmp_path / "xdg", cwd=tmp_path / "work"),
                                  lambda: verify(path, "--rebuild", xdg=tmp_path / "xdg", cwd=tmp_path / "work")])
    assert_verified(plain)
    assert rebuild.returncode != 0 and last_line(rebuild).startswith("FAILED"), rebuild.output[-3000:]
    fails = [ln for ln in rebuild.output.splitlines() if ln.startswith("FAIL")]
    assert any("rebuild" in ln and "cannot be rebuilt" in ln for ln in fails), rebuild.output[-3000:]
    assert "Traceback" not in rebuild.output
