"""``backend=iree``: the same exported program compiled by IREE (llvm-cpu) instead of XLA.

The program ``export`` produced for XLA is compiled by ``iree-compile`` for the host CPU with the
flags that made IREE's large matmuls fast here (``FLAGS``), into IREE modules (``.vmfb``) kept in the
artifact and run by ``iree.runtime`` behind the same ``Executable`` signature, checks and dispatch.

Two modes, recorded in the manifest (``iree.mode`` and why):

- ``dynamic``: one module serves every in-range shape without padding, IREE's own dynamic shapes.
  The prepared weights are constants of the module, which IREE packs for its kernels at compile time:
  with weights as arguments it repacks them on every call (2.5-5x slower for GEGLU here). So an IREE
  artifact carries the weights twice: packed in the module, and as ``weights/*.npy`` (its identity,
  ``verify``, rebuilding); new weights need a new module, so ``bind`` of weights is refused.
- ``profiles``: where IREE cannot compile the dynamic program (the transformer block: a
  ``stablehlo.dynamic_broadcast_in_dim`` without known expanding dims), one static module per shape
  profile, with the weights as arguments (stored once), served by padding like XLA's profiles.

IREE is an optional extra (``pip install -e '.[iree]'``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ArtifactError, CompileError, SpecError

FORMAT = "iree-vmfb"
FLAGS = ("--iree-llvmcpu-target-cpu=host", "--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all")
DRIVER = "local-task"


def require() -> None:
    try:
        import iree.compiler
        import iree.runtime

        del iree
    except ImportError:
        raise SpecError("backend=iree needs IREE: pip install -e '.[iree]' (iree-base-compiler and "
                        "iree-base-runtime).") from None


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {"iree-base-compiler": version("iree-base-compiler"), "iree-base-runtime": version("iree-base-runtime")}


def incompatibility(recorded: dict[str, Any]) -> str | None:
    """Why a module built with ``recorded`` dependencies cannot run here, or None.

    IREE's module format is versioned with the compiler, so the runtime must be the compiler's release;
    the module is compiled for the build host's CPU (``--iree-llvmcpu-target-cpu=host``).
    """
    from importlib.metadata import PackageNotFoundError, version

    from .. import host

    try:
        runtime = version("iree-base-runtime")
    except PackageNotFoundError:
        return "an IREE module, and IREE is not installed here (pip install -e '.[iree]')"
    if recorded.get("iree-base-compiler") != runtime:
        return f"compiled by IREE {recorded.get('iree-base-compiler')}, this host has iree-base-runtime {runtime}"
    here = host.host_features()
    for key in ("machine", "system"):
        if recorded.get(key) != here[key]:
            return f"built for {key} {recorded.get(key)!r}, this host has {here[key]!r}"
    missing = sorted(set(recorded.get("cpu_features", "").split()) - set(here["cpu_features"].split()))
    if missing:
        return f"compiled for a CPU with features this host lacks ({', '.join(missing[:8])})"
    return None


def compile_mlir(mlir: str) -> bytes:
    import logging

    from iree import compiler

    quiet = _DropToolInvocations()
    logging.getLogger().addFilter(quiet)  # iree.compiler logs every iree-compile command line at INFO on root
    try:
        return bytes(compiler.compile_str(mlir, target_backends=["llvm-cpu"], input_type="stablehlo",
                                          extra_args=list(FLAGS)))
    finally:
        logging.getLogger().removeFilter(quiet)


class _DropToolInvocations:
    def filter(self, record: Any) -> bool:
        return not str(record.msg).startswith("Invoke IREE Tool")


def first_error(err: Exception) -> str:
    """IREE's first ``error:`` line, without the IR that follows it."""
    lines = [ln.strip() for ln in str(err).splitlines() if "error:" in ln] or [str(err).splitlines()[0]]
    line = lines[0].split("error:", 1)[-1].split(": %")[0].strip()
    if line.startswith("loc(") and "): " in line:
        line = line.rsplit("): ", 1)[1]
    return line[:240].rstrip(":")


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
    import jax

    from ..compiler.export import deterministic_locations

    t0 = time.perf_counter()
    lead = [np.asarray(x) for x in leading]
    with deterministic_locations():
        exported = jax.export.export(jax.jit(lambda *args: main.call(*lead, *args)), platforms=("cpu",))(*specs)
    try:
        return compile_mlir(annotate_broadcasts(exported.mlir_module())), None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - iree.compiler.CompilerToolError for what IREE cannot lower
        return None, first_error(e), time.perf_counter() - t0


def compile_static(main: Any, shapes: Sequence[Sequence[int]]) -> tuple[bytes, float]:
    """The program for one concrete shape per input (weights included, as arguments)."""
    import jax

    t0 = time.perf_counter()
    specs = [jax.ShapeDtypeStruct(tuple(s), a.dtype) for s, a in zip(shapes, main.in_avals)]
    from jax._src.interpreters import mlir as jax_mlir

    # XLA refines the exported program's symbolic shapes to the call's static ones when it compiles;
    # IREE gets the refined module, as it cannot lower every dynamic op of the symbolic one.
    module = jax_mlir.refine_polymorphic_shapes(jax.jit(main.call).lower(*specs).compiler_ir("stablehlo"))
    try:
        return compile_mlir(str(module)), time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - iree.compiler.CompilerToolError
        shown = " x ".join(str(tuple(s)) for s in shapes[-3:])
        raise CompileError(f"IREE cannot compile the program for the input shapes {shown}: {first_error(e)}. "
                           "Build this model with backend=cpu (XLA), or give it other shape ranges.") from None


class Module:
    """A loaded IREE module's ``main``, called like a compiled XLA program: leading (weights) args first."""

    def __init__(self, vmfb: bytes, skip: int, out_tree: Any, where: str):
        from iree import runtime as rt

        try:
            config = rt.Config(DRIVER)
            context = rt.SystemContext(config=config)
            module = rt.VmModule.copy_buffer(config.vm_instance, vmfb)
            context.add_vm_module(module)
            self._main = context.modules[module.name]["main"]
        except Exception as e:  # noqa: BLE001 - IREE's own errors for a file that is not a module
            raise ArtifactError(f"{where}: cannot load the IREE module ({type(e).__name__}: {str(e)[:200]}).") from None
        self._skip = skip  # leading arguments the module holds itself (the weights of a dynamic module)
        self._out_tree = out_tree

    def flat(self, args: Sequence[Any]) -> list[np.ndarray]:
        out = self._main(*[np.asarray(a) for a in args[self._skip:]])
        outs = out if isinstance(out, (list, tuple)) else [out]
        # A copy: to_host() maps IREE's buffer, which is recycled once the call's result is released,
        # while jax.device_put and numpy callers may keep aliasing the memory they were given.
        return [np.array(o.to_host() if hasattr(o, "to_host") else o, copy=True) for o in outs]

    def __call__(self, *args: Any) -> Any:
        import jax

        return jax.tree_util.tree_unflatten(self._out_tree, [jax.device_put(o) for o in self.flat(args)])


def loader(vmfb: bytes, entry: dict[str, Any], out_tree: Any, n_leading: int, where: str) -> Callable[[], Module]:
    return lambda: Module(vmfb, n_leading if entry.get("dynamic") else 0, out_tree, where)
