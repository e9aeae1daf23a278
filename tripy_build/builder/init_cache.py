"""A model's random init, made once and shared: by the builds of one process, and by a sweep's processes.

A sweep's jobs that differ only in how they compile (optimization level, precision, shapes, target
platforms) need the same init; it was 20-25% of a small model's build (a jit compile and the random
weights). Only for models whose init has no other effect (``model.pure_init``). Kept in memory bounded
by bytes (arrays made read-only, each build given its own containers), and shared between processes
through a directory (a sweep's ``.shared-init/``) as ``.npz`` files written atomically.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from . import model as model_io
from .request import BuildRequest

log = logging.getLogger(__name__)

_INIT_MEMO: OrderedDict[str, tuple[Any, int]] = OrderedDict()  # key -> (params, bytes)
INIT_MEMO_MAX_BYTES = 256 << 20
_INIT_LOCK = threading.Lock()  # builds may run in threads


def initial_params(request: BuildRequest, model: Any, parts: dict[str, Any]) -> Any:
    """The model's init at the config's seed: from ``_INIT_MEMO`` when this process made it already, else
    from ``request.shared_init_dir`` when another process did (and shared there when none had)."""
    import jax
    import numpy as np

    from ..compiler.selftest import run_once

    def init() -> Any:
        return jax.device_get(model_io.run_init(lambda: run_once(model.init, jax.random.PRNGKey(request.params_seed))))

    if not model_io.pure_init(model):
        return init()
    key = json.dumps([parts["config"]["model"], parts["model_code"], parts["params"], parts["toolchain"],
                      parts["target"]["cpu"]], sort_keys=True)
    with _INIT_LOCK:
        kept = _INIT_MEMO.get(key)
        if kept is not None:
            _INIT_MEMO.move_to_end(key)
    if kept is not None:
        params = kept[0]
    else:
        shared = Path(request.shared_init_dir) / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz" \
            if request.shared_init_dir else None
        params = _read_shared_init(shared, model, request.params_seed) if shared is not None else None
        if params is None:
            params = init()
            if shared is not None:
                _share_init(shared, params)
        leaves = [x for x in jax.tree_util.tree_leaves(params) if isinstance(x, np.ndarray)]
        for leaf in leaves:
            leaf.flags.writeable = False
        size = sum(x.nbytes for x in leaves)
        with _INIT_LOCK:
            if size <= INIT_MEMO_MAX_BYTES:
                _INIT_MEMO[key] = (params, size)
                while sum(n for _, n in _INIT_MEMO.values()) > INIT_MEMO_MAX_BYTES:
                    _INIT_MEMO.popitem(last=False)  # the least recently used; never the one just added
    return jax.tree_util.tree_map(lambda leaf: leaf, params)


def _read_shared_init(path: Path, model: Any, seed: int) -> Any:
    """The init another process shared at ``path``, or None: none there, unreadable, or not this model's
    tree of shapes and dtypes (the structure comes from tracing the init, which runs nothing)."""
    import jax
    import numpy as np

    from ..artifact.npy import as_dtype

    if not path.is_file():
        return None
    like, treedef = jax.tree_util.tree_flatten(model_io.run_init(lambda: jax.eval_shape(model.init, jax.random.PRNGKey(seed))))
    try:
        with np.load(path, allow_pickle=False) as stored:
            if len(stored.files) != len(like):
                return None
            leaves = [stored[f"arr_{i}"] for i in range(len(like))]
    except (OSError, ValueError, KeyError) as e:
        log.warning("shared init %s is unreadable, initializing instead: %s", path, e)
        return None
    leaves = [as_dtype(got, want.dtype) if got.shape == tuple(want.shape) else None for got, want in zip(leaves, like)]
    if any(leaf is None for leaf in leaves):
        return None
    log.info("init params shared by another process: %s", path.name)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _share_init(path: Path, params: Any) -> None:
    """Write ``params`` for other processes at ``path`` (atomically, replacing a file there that did not
    match), within the memo's size bound; a failure to write costs them an init, not the build."""
    import tempfile

    import jax
    import numpy as np

    leaves = jax.tree_util.tree_leaves(params)
    if sum(np.asarray(x).nbytes for x in leaves) > INIT_MEMO_MAX_BYTES:
        return
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False) as f:
            temporary = f.name
            np.savez(f, *leaves)
        os.replace(temporary, path)
    except OSError as e:
        log.warning("could not share the init params at %s: %s", path, e)
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
