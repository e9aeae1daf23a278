"""``backend=iree`` at build: the exported program compiled by IREE (llvm-cpu) instead of XLA.

Two modes, recorded in the manifest (``compiler.mode`` and why):

- ``dynamic``: one module serves every in-range shape without padding, IREE's own dynamic shapes.
  The prepared weights are constants of the module, which IREE packs for its kernels at compile time:
  with weights as arguments it repacks them on every call (2.5-5x slower for GEGLU here). So an IREE
  artifact carries the weights twice: packed in the module, and as ``weights/*.npy`` (its identity,
  ``verify``, rebuilding); new weights need a new module, so ``bind`` of weights is refused.
- ``profiles``: where IREE cannot compile the dynamic program (the transformer block: a
  ``stablehlo.dynamic_broadcast_in_dim`` without known expanding dims), one static module per shape
  profile, with the weights as arguments (stored once), served by padding like XLA's profiles.

Loading and running modules, and compiling one for concrete shapes (which a loaded artifact may need),
are ``runtime/iree.py``'s.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..artifact.manifest import IREE_FORMAT, Compiler, ExecutableEntry
from ..host import host_features
from ..runtime import iree as iree_runtime
from ..runtime.compiled import Precompiled
from .export import deterministic_locations, symbolic_specs


def annotate_broadcasts(text: str) -> str:
    """Mark which dims of each ``stablehlo.dynamic_broadcast_in_dim`` expand, which IREE needs to lower it.

    JAX only broadcasts an operand dim that is 1 or provably equal to the result's dim, so in its
    programs a symbolic (``?``) operand dim never expands, a static dim larger than 1 never does, and a
    static 1 mapped to a result dim that is not a static 1 does (expanding a 1 to a 1 is also correct).
    """
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir

    with jax_mlir.make_ir_context():
        module = ir.Module.parse(text)

        def visit(op: Any) -> Any:
            if op.name == "stablehlo.dynamic_broadcast_in_dim":
                operand, result = ir.RankedTensorType(op.operands[0].type), ir.RankedTensorType(op.results[0].type)
                dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
                expanding = [i for i in range(operand.rank) if not operand.is_dynamic_dim(i)
                             and operand.get_dim_size(i) == 1
                             and (result.is_dynamic_dim(dims[i]) or result.get_dim_size(dims[i]) != 1)]
                op.attributes["known_expanding_dimensions"] = ir.DenseI64ArrayAttr.get(expanding)
                op.attributes["known_nonexpanding_dimensions"] = ir.DenseI64ArrayAttr.get(
                    [i for i in range(operand.rank) if i not in expanding])
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        return str(module)


def compile_dynamic(main: Any, leading: Sequence[Any], specs: Sequence[Any]) -> tuple[bytes | None, str | None, float]:
    """The whole program as one dynamic-shape module with the weights inside; (vmfb, why not, seconds)."""
    t0 = time.perf_counter()
    lead = [np.asarray(x) for x in leading]
    with deterministic_locations():
        exported = jax.export.export(jax.jit(lambda *args: main.call(*lead, *args)), platforms=("cpu",))(*specs)
    try:
        return iree_runtime.compile_mlir(annotate_broadcasts(exported.mlir_module())), None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - iree.compiler.CompilerToolError for what IREE cannot lower
        return None, iree_runtime.first_error(e), time.perf_counter() - t0


def compile_profiles(leaves: Sequence[Any], leading: Sequence[Any], program: Any,
                     shapes: Sequence[Sequence[Sequence[int]]], targets: Sequence[tuple[int, ...]], n_sizes: int,
                     log: Callable[[str, float], None],
                     compile_all: Callable) -> tuple[list[Precompiled], Precompiled | None, Compiler]:
    """IREE modules: one for every shape if IREE accepts the dynamic program, else one per profile
    (``compile_all`` runs those in the compiler's pool); (the profiles, the one module for every shape or None,
    how they were compiled). ``leaves``: the runtime inputs (path, ``InputInfo``); ``leading``: the weights."""
    base = ExecutableEntry("", IREE_FORMAT, "cpu", flags=tuple(iree_runtime.FLAGS),
                           depends_on=dict(host_features(), **iree_runtime.versions()))
    specs, _ = symbolic_specs(list(leaves))
    vmfb, reason, seconds = compile_dynamic(program.main, leading,
                                            [*specs, *[jax.ShapeDtypeStruct((), "int32")] * n_sizes])
    n_lead = len(program.sources)
    out_tree = program.main.out_tree
    if vmfb is not None:
        entry = dataclasses.replace(base, dynamic=True)
        pre = Precompiled((), vmfb, entry, iree_runtime.loader(vmfb, entry, out_tree, n_lead, "iree")(), seconds=seconds)
        log("compile (one dynamic-shape module)", seconds)
        return [], pre, Compiler("iree", "dynamic", None, tuple(iree_runtime.FLAGS))
    log(f"  IREE rejected the dynamic program ({reason}); one module per profile", seconds)

    def one(i: int, profile: dict[str, int]) -> Precompiled:
        blob, secs = iree_runtime.compile_static(program.main, shapes[i])
        entry = dataclasses.replace(base, profile=profile)
        return Precompiled(tuple(targets[i]), blob, entry, iree_runtime.loader(blob, entry, out_tree, n_lead, "iree")(),
                           seconds=secs)

    t0 = time.perf_counter()
    compiled = compile_all(one)
    log(f"compile {len(compiled)} profile(s)", time.perf_counter() - t0)
    return compiled, None, Compiler("iree", "profiles", reason, tuple(iree_runtime.FLAGS))
