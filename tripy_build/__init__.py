"""tripy_build: declarative, ahead-of-time builds of JAX models into self-describing artifacts.

The names that need jax (``compile``, ``load``, ``Executable``, ``CompiledModel``) are imported on first use, so that
``tripy_build.runtime``, which runs a built artifact without jax, starts fast.
"""

from . import host
from .version import __version__
from .errors import TripyBuildError
from .core.spec import DimSize, InputInfo, NamedDimension
from .core.entry import Entry

_LAZY = {"compile": "compiler.pipeline", "load": "runtime.loader", "Executable": "runtime.executable",
         "CompiledModel": "runtime.compiled", "CompatibilityWarning": "artifact.compat"}

__all__ = ["compile", "load", "Executable", "CompiledModel", "Entry", "InputInfo", "NamedDimension", "DimSize", "TripyBuildError",
           "CompatibilityWarning", "__version__"]


host.quiet_without_gpu()


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tripy_build' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
