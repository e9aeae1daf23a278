"""A profile compiled on this host: for a shape no precompiled profile covers, or for an artifact whose machine
code is not trusted (``load(trust_executables=False)``).

It is compiled from the model's exported program, with the options its platform's executables were compiled
with, through the compile cache (``runtime/compile_cache.py``), so that the next process loads it instead.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from .. import host
from ..artifact.manifest import ExecutableEntry
from .compile_cache import key as compile_cache_key, shared as shared_compile_cache
from .compiled import CompiledModel
from .xla import compile_shapes, load as load_xla, local_platform, serialize as serialize_xla

log = logging.getLogger(__name__)


def compile_profile(model: CompiledModel, target: tuple[int, ...]) -> Callable:
    """``model``'s exported program compiled for ``target`` (a size per dim) on this host's platform."""
    program = model.program
    shapes: list[Any] = [a.shape for a in program.leading_avals()]
    shapes += list(model.dispatcher.leaf_shapes(target)) + [()] * len(model.sizes)
    platform = local_platform()
    iree = model.compiler.name == "iree"
    if iree:
        from .iree import FLAGS, Module, compile_static, versions

        options = {"iree": list(FLAGS), **versions()}
    else:
        options = dict(model.compiler_options.get(platform, {}))
    cache = shared_compile_cache() if host.tested_jax() else None
    key = compile_cache_key(program=model.program_digest, shapes=shapes, platform=platform, options=options,
                            host=host.host_features(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                            **({"donate": model.donate_argnums} if model.donated else {}))
    hit = cache.get(key) if cache is not None else None
    label = ", ".join(f"{d.name or d.symbol}={n}" for d, n in zip(model.dims, target))
    out_tree = program.main.out_tree
    if hit is not None:
        blob, meta = hit
        try:
            fn = (Module(blob, 0, out_tree, "compile cache") if iree else
                  load_xla(blob, ExecutableEntry.from_json(meta), out_tree, model.name, platform))
            log.info("%s: %s loaded from the compile cache", model.name, label)
            return fn
        except Exception as e:  # noqa: BLE001 - a bad entry is recompiled, never fatal
            log.warning("%s: compile cache entry for %s unusable (%s); compiling", model.name, label, e)
    t0 = time.perf_counter()
    if iree:
        blob, _ = compile_static(program.main, shapes)
        compiled, meta = Module(blob, 0, out_tree, model.name), {}
    else:
        compiled = compile_shapes(program.main, shapes, options, model.donate_argnums)
    log.info("%s: compiled %s on first use in %.0f ms (no profile covers it)", model.name, label,
             (time.perf_counter() - t0) * 1e3)
    if cache is not None:
        if not iree:
            blob, entry = serialize_xla(compiled, platform)
            meta = entry.to_json()
        cache.put(key, blob, meta)
    return compiled
