"""``tripy-build list``'s reading of a build's recorded config: the settings an artifact does not record come from
one home, ``artifact.manifest.RECORDED_CONFIG_DEFAULTS`` (through ``Manifest.build_config``), and equal today's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tripy_build.artifact.describe import list_row
from tripy_build.artifact.manifest import RECORDED_CONFIG_DEFAULTS
from tripy_build.artifact.read import read_manifest
from tripy_build.builder.key import recorded_config
from tripy_build.builder.request import BuildRequest
from tripy_build.cli import config
from tripy_build.cli.listing import recorded_settings
from tripy_build.runtime.save import DEFAULT_WEIGHTS

from conftest import compose_cfg


def _record(path: Path, recorded: dict | None) -> None:
    """Make the artifact at ``path`` say it was built with ``recorded`` as its config (None: saved from the API)."""
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["metadata"].pop("build_key_parts", None)
    if recorded is not None:
        manifest["metadata"]["build_key_parts"] = {"config": recorded, "params": {"init": "random", "seed": 0}}
    (path / "manifest.json").write_text(json.dumps(manifest))


def _listed(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    row = list_row(path)
    del row["date"], row["size"]  # the manifest's mtime and length, rewritten by each ``_record``
    return row, recorded_settings(read_manifest(path))


def test_the_recorded_config_defaults_are_todays_defaults_but_weights():
    """A build records every setting of the table, each as today's default config makes it: the table says what a
    build that did not record it was made with, and only weights' default changed since (raw, now prepared)."""
    request = config.validate(compose_cfg(["model=geglu", "shapes=static"]))
    assert set(RECORDED_CONFIG_DEFAULTS) <= set(recorded_config(request))  # a new record carries every one
    assert set(RECORDED_CONFIG_DEFAULTS) <= {f.name for f in dataclasses.fields(BuildRequest)}
    today = {k: getattr(request, k) for k in RECORDED_CONFIG_DEFAULTS}
    assert today == {**RECORDED_CONFIG_DEFAULTS, "weights": DEFAULT_WEIGHTS}
    assert RECORDED_CONFIG_DEFAULTS["weights"] == "raw" and DEFAULT_WEIGHTS == "prepared"
    defaults = {f.name: f.default for f in dataclasses.fields(BuildRequest)
                if f.name in RECORDED_CONFIG_DEFAULTS and f.default is not dataclasses.MISSING}
    assert defaults == {k: today[k] for k in defaults} and {"target_gpu", "weights"} <= set(defaults)


def test_an_artifact_that_records_fewer_settings_lists_as_one_built_with_the_defaults(artifact_copy):
    full = {"shapes_name": "static", "platforms": ["cpu"], "model": {"name": "geglu"}, **RECORDED_CONFIG_DEFAULTS}
    _record(artifact_copy, full)
    explicit = _listed(artifact_copy)
    _record(artifact_copy, {k: v for k, v in full.items() if k not in RECORDED_CONFIG_DEFAULTS})
    assert read_manifest(artifact_copy).build_config == full
    assert _listed(artifact_copy) == explicit
    row, settings = explicit
    assert row["options"].split()[1:] == ["O3", "float32"]  # no cpu=, gpu=: the host's
    assert {k: settings[k] for k in ("backend", "precision", "target.cpu", "target.gpu", "weights")} == {
        "backend": "cpu", "precision": "float32", "target.cpu": "host", "target.gpu": "host", "weights": "raw"}

    _record(artifact_copy, {**full, "target_cpu": "x86-64-v3", "target_gpu": "h100", "compiler": "iree",
                            "precision": "bfloat16", "weights": "prepared"})
    row, settings = _listed(artifact_copy)
    assert row["options"].split()[2:] == ["bfloat16", "cpu=x86-64-v3", "gpu=h100"]
    assert {k: settings[k] for k in ("backend", "precision", "target.cpu", "target.gpu", "weights")} == {
        "backend": "iree", "precision": "bfloat16", "target.cpu": "x86-64-v3", "target.gpu": "h100",
        "weights": "prepared"}

    _record(artifact_copy, None)  # saved from the API: no config, every setting its default
    assert read_manifest(artifact_copy).build_config == dict(RECORDED_CONFIG_DEFAULTS)
    row, settings = _listed(artifact_copy)
    assert row["options"].split()[1:] == ["O3", "float32"] and settings["target.cpu"] == "host"


def test_a_rebuild_of_an_older_record_takes_the_same_defaults(artifact_copy, tmp_path):
    """``request_from_record`` reads the record through the same home: an artifact recorded before weights and
    compiler were is rebuilt with weights=raw (as it was stored) on XLA, not with today's weights=prepared."""
    from tripy_build.builder.key import request_from_record

    request = config.validate(compose_cfg(["model=geglu", "shapes=static"]))
    _record(artifact_copy, {k: v for k, v in recorded_config(request).items() if k not in RECORDED_CONFIG_DEFAULTS})
    again = request_from_record(read_manifest(artifact_copy), artifact_copy, tmp_path)
    assert {k: getattr(again, k) for k in RECORDED_CONFIG_DEFAULTS} == RECORDED_CONFIG_DEFAULTS
    assert dataclasses.replace(again, weights=request.weights, artifacts_dir=request.artifacts_dir,
                               force=request.force) == request
