"""IREE modules at run time: loading and calling them, and compiling the program for concrete shapes.

The program ``export`` produced for XLA is compiled by ``iree-compile`` for the host CPU with the
flags that made IREE's large matmuls fast here (``FLAGS``), into IREE modules (``.vmfb``) kept in the
artifact and run by ``iree.runtime`` behind the same ``Executable`` signature, checks and dispatch.
How a build chooses between one dynamic module and one per profile is ``compiler/iree.py``'s.

IREE is an optional extra (``pip install -e '.[iree]'``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from ..artifact.manifest import ExecutableEntry
from ..errors import ArtifactError, CompileError, SpecError

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


def loader(vmfb: bytes, entry: ExecutableEntry, out_tree: Any, n_leading: int, where: str) -> Callable[[], Module]:
    return lambda: Module(vmfb, n_leading if entry.dynamic else 0, out_tree, where)
