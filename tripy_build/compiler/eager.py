"""``TRIPY_BUILD_DISABLE_COMPILE=1``: ``compile`` returns a function that runs eagerly, for debugging.

Nothing is traced or compiled: every call runs the user's function op by op on the inputs, so
``print``, ``breakpoint()`` and a debugger see real values. The signature and every input check
are the compiled executable's (``signature.py``), so a call that works here works compiled. It
cannot be saved: there is nothing compiled to save.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from ..errors import TraceError, TripyBuildError
from ..core.signature import Parameter, bind_call, check_leaves, input_infos, named_uses
from ..core.spec import DimSize, InputInfo, flatten_like

ENV = "TRIPY_BUILD_DISABLE_COMPILE"


def disabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no")


class EagerFunction:
    """What ``compile`` returns while compiling is disabled: checked calls of the function, run eagerly."""

    def __init__(self, flat: Callable, parameters: Sequence[Parameter], leaves: Sequence[tuple[str, InputInfo]],
                 sizes: Sequence[tuple[str, DimSize]]):
        self._flat = flat
        self._parameters = list(parameters)
        self._leaves = list(leaves)
        self._uses = named_uses(self._leaves)
        self._size_names = [s.name for _, s in sizes]
        self.__name__ = flat.__name__
        for path, size in sizes:
            if size.name not in self._uses:
                raise TraceError(f"argument '{path}' is {size!r}, but no input has a NamedDimension {size.name!r}; "
                                 f"named dims: {', '.join(map(repr, sorted(self._uses))) or 'none'}.")

    @property
    def input_infos(self) -> dict[str, Any]:
        return input_infos(self._leaves, self._parameters)

    def __repr__(self) -> str:
        return f"<tripy_build eager {self.__name__} (compiling disabled by {ENV})>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import jax.numpy as jnp

        values = bind_call(self.__name__, self._parameters, args, kwargs, self.input_infos.__getitem__)
        leaves: list[Any] = []
        for p in self._parameters:
            flatten_like(p.template, values[p.name], p.name, leaves)
        shapes = check_leaves(leaves, self._leaves, self._uses)
        sizes = [shapes[self._uses[n][0][0]][self._uses[n][0][1]] for n in self._size_names]
        return self._flat(*[jnp.asarray(x) for x in leaves], *[jnp.int32(n) for n in sizes])

    def save(self, path: Any) -> str:
        raise TripyBuildError(f"{self.__name__} was not compiled ({ENV} is set), so there is nothing to save; "
                              f"unset {ENV} and compile again.")
