"""Run a built artifact: ``tripy_build.runtime.load`` without jax (numpy in, numpy out), and the jax-backed
``Executable`` that ``tripy_build.load`` returns (imported only when asked for)."""

from .runtime import Runtime, load

__all__ = ["Runtime", "load"]
