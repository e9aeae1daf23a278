"""A build cache shared by machines: ``cache.remote`` names an fsspec URL (a shared folder, ``s3://``,
``gs://``, ``memory://``...) that builds look their key up in first and upload to after.

Each artifact is one object, ``<model>/<build key>.tar`` (uncompressed: the weights dominate and do not
compress), so it appears whole or not at all on any store: it is written under a temporary name unique
to the host and process and then moved into place, and a second writer of the same key keeps the first.
A download is never trusted as it is: the tar is read into a temporary directory next to the target,
member by member (regular files with safe relative paths only, nothing else extracted), every file is
checked against the manifest's digests, and only then is the directory renamed into the artifacts
folder. A damaged or foreign object is a miss with a warning, and the build goes on locally.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from ..artifact.digest import file_names
from ..artifact.layout import INDEX, MANIFEST, is_artifact, safe_relpath
from ..artifact.read import read_manifest, verify_files
from ..artifact.write import temporary_prefix
from ..errors import ArtifactError, ConfigError
from ..host import hostname

log = logging.getLogger(__name__)


class Store:
    """The remote cache at ``url`` (any fsspec protocol)."""

    def __init__(self, url: str):
        try:
            import fsspec
        except ImportError:
            raise ConfigError("cache.remote: needs fsspec: pip install -e '.[remote]' (and the protocol's own "
                              "package, e.g. s3fs for s3://).") from None
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as e:
            raise ConfigError(f"cache.remote: cannot open {url!r} ({e}).") from None
        self.url = url

    def _object(self, model: str, key: str) -> str:
        return f"{self.root.rstrip('/')}/{model}/{key}.tar"

    def has(self, model: str, key: str) -> bool:
        return bool(self.fs.exists(self._object(model, key)))

    def fetch(self, model: str, key: str, target: Path) -> bool:
        """Download the artifact into ``target`` (absent); True if it is there now, checked."""
        obj = self._object(model, key)
        try:
            if not self.fs.exists(obj):
                return False
            data = self.fs.cat_file(obj)
        except OSError as e:
            log.warning("remote cache %s: cannot read %s (%s); building locally", self.url, obj, e)
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(target), dir=target.parent))
        try:
            _extract(data, tmp)
            verify_files(tmp)
            if (read_manifest(tmp).build_key or "")[:len(key)] != key:
                raise ArtifactError(f"{obj}: holds an artifact of another build key")
            try:
                os.rename(tmp, target)
            except OSError:
                if not is_artifact(target):
                    raise
            return True
        except (ArtifactError, OSError, tarfile.TarError) as e:
            log.warning("remote cache %s: %s is not a usable artifact (%s); building locally", self.url, obj, e)
            return False
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def put(self, path: Path, model: str, key: str) -> bool:
        """Upload the artifact at ``path`` unless the store has this key; True if this call uploaded it."""
        obj = self._object(model, key)
        if self.has(model, key):
            return False
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel in sorted([*file_names(path), INDEX, MANIFEST]):
                tar.add(path / rel, arcname=rel, recursive=False)
        tmp = f"{obj}.tmp-{os.getpid()}@{hostname()}"
        self.fs.makedirs(obj.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(tmp, buf.getvalue())
        if self.has(model, key):  # another builder got there first: keep theirs
            self.fs.rm(tmp)
            return False
        self.fs.mv(tmp, obj)
        return True


def _extract(data: bytes, dest: Path) -> None:
    """Regular files with safe relative paths only; anything else in the tar is an error."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar.getmembers():
            rel = safe_relpath(member.name)
            if not member.isfile():
                raise ArtifactError(f"member {member.name!r} is not a regular file")
            out = dest / PurePosixPath(rel)
            out.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            out.write_bytes(source.read() if source is not None else b"")
