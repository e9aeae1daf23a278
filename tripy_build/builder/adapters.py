"""Adapters that give a library's module, or a plain function, the zoo's protocol.

- **Flax NNX** (a ``flax.nnx.Module`` subclass): constructed with ``rngs=nnx.Rngs(key)``, put in eval
  mode, split into its graph and state; params are the ``nnx.State`` of every variable but the RNG
  streams (``nnx.Param``, batch statistics...), merged back in ``apply``.
- **Flax Linen** (a ``flax.linen.Module`` subclass): ``module.init(key, *inputs at their opt shapes)``;
  params are the variables dict it returns (``{"params": ..., "batch_stats": ...}``).
- **Equinox** (an ``equinox.Module`` subclass): constructed with ``key=key``, partitioned into its
  arrays (the params: the module itself with its non-array fields left out) and the rest; a module
  that acts on one example is mapped with ``jax.vmap`` over the dim the config's ``vmap`` names.
- **A function** ``apply(params, *inputs)``, with ``init: module.function`` naming ``init(key, **settings)``.

The config declares the inputs (``inputs: {x: [batch, 64]}``, optionally ``input_dtypes``) and constant
call arguments (``call: {train: false}``); they reach the call by name (``CallBinding``). Every other
key is a constructor argument (for a function, an ``init`` argument). Flax and Equinox are imported
only when a model's class comes from them.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

from ..core.spec import NamedDimension, to_dtype
from ..errors import ConfigError


# What a constructor raises for settings it refuses (a wrong name, a value out of range, an assert).
SETTING_ERRORS = (TypeError, ValueError, AssertionError)


def refused(target_path: str, settings: dict[str, Any], err: Exception, signature: str = "") -> ConfigError:
    """A model's constructor refused the config's settings: its reason, and the ``model.*`` keys it names
    (all of them when it names none), with their values."""
    reason = str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else type(err).__name__
    named = [k for k in settings if re.search(rf"\b{re.escape(k)}\b", reason)] or list(settings)
    given = ", ".join(f"model.{k}={settings[k]!r}" for k in named) or "no settings"
    return ConfigError(f"model: {target_path} refused its settings ({given}): {reason}"
                       + (f"; its signature: {signature}" if signature else "") + ".")


def _import(path: str, key: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{key}: cannot import {path!r} ({e}); give a module.Class or module.function path.") from None


class LibraryModel:
    """The protocol for a module or function that does not implement it: inputs come from the config."""

    framework = ""

    def __init__(self, target: Any, target_path: str, kwargs: dict[str, Any], cfg: dict[str, Any],
                 dims: dict[str, Any]):
        self.target, self.target_path, self.kwargs, self.dims = target, target_path, kwargs, dims
        self._inputs = _declared_inputs(cfg, target_path)
        dtypes = cfg.get("input_dtypes") or {}
        if not isinstance(dtypes, dict) or set(dtypes) - set(self._inputs):
            raise ConfigError(f"model.input_dtypes: must map input names ({', '.join(self._inputs)}) to dtypes, "
                              f"got {dtypes!r}.")
        for name, dtype in dtypes.items():
            try:
                to_dtype(dtype)
            except Exception:  # noqa: BLE001 - numpy raises TypeError or others for an unknown name
                raise ConfigError(f"model.input_dtypes.{name}: unknown dtype {dtype!r}; e.g. float32, int32, bfloat16.") from None
        self._dtypes = {n: str(dtypes.get(n, "float32")) for n in self._inputs}
        values = cfg.get("input_values") or {}
        if not isinstance(values, dict) or set(values) - set(self._inputs) or not all(
                isinstance(v, (list, tuple)) and len(v) == 2 for v in values.values()):
            raise ConfigError(f"model.input_values: must map integer input names ({', '.join(self._inputs)}) to "
                              f"[lo, hi), the values they may hold (token ids: [0, vocab_size]), got {values!r}.")
        self._values = {n: tuple(v) for n, v in values.items()}
        if cfg.get("vmap") is not None and self.framework != "equinox":
            raise ConfigError(f"model.vmap: only Equinox modules are mapped over a dim; {target_path} is a "
                              f"{self.framework} model. Remove model.vmap.")
        if cfg.get("init") is not None and self.framework != "function":
            raise ConfigError(f"model.init: only a function model names its init; {target_path} is a "
                              f"{self.framework} module, constructed from its class.")
        self.padding = {d: k for d, k in (cfg.get("padding") or {}).items()}
        self.call_kwargs = cfg.get("call") or {}
        if not isinstance(self.call_kwargs, dict):
            raise ConfigError(f"model.call: must map the call's keyword arguments to constants (e.g. "
                              f"`call: {{train: false}}`), got {self.call_kwargs!r}.")
        self.apply = _with_signature(self._traced(self._apply), ["params", *self._inputs])
        self._check_settings()
        self.call = CallBinding(self.call_target(), self.call_name(), list(self._inputs), self.call_kwargs)

    def call_target(self) -> Any:
        """What ``apply`` calls with the inputs: the module's ``__call__``, or the function."""
        return self.target.__call__ if inspect.isclass(self.target) else self.target

    def call_name(self) -> str:
        return f"{self.target_path}.__call__" if inspect.isclass(self.target) else self.target_path

    def _traced(self, fn: Any) -> Any:
        """``fn`` with the likely cause of an error raised while tracing it added to the error (a note that
        ``errors.raised_in_user_code`` shows under the model's line)."""
        def traced(*args: Any) -> Any:
            try:
                return fn(*args)
            except Exception as err:
                hint = self.likely_cause(err)
                if hint:
                    err.add_note(f"Likely cause: {hint}")
                raise
        return traced

    def likely_cause(self, err: Exception) -> str | None:
        """What probably went wrong when the module raised ``err`` while being traced, or None."""
        if self.call.positional and len(self._inputs) > 1 and _is_shape_error(err):
            return (f"the inputs are passed by position in the order model.inputs lists them "
                    f"({', '.join(self._inputs)}); {self.call.name} may expect another order.")
        return None

    # what the framework passes to the constructor besides the config's settings
    construct_with: dict[str, Any] = {}

    def _check_settings(self, fn: Any = None, *args: Any) -> None:
        """Refuse settings the constructor does not take now, not after a trace has started."""
        fn = fn or self.target
        try:  # a class's own __init__: NNX's metaclass hides it behind (*args, **kwargs)
            signature = inspect.signature(fn.__init__ if inspect.isclass(fn) else fn)
        except (TypeError, ValueError):
            return
        if inspect.isclass(fn):
            args = (None, *args)
        params = signature.parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        unknown = [k for k in self.kwargs if k not in params and not takes_any]
        try:
            if unknown:
                raise TypeError(f"no setting {unknown[0]!r}")
            signature.bind(*args, **self.kwargs, **self.construct_with)
        except TypeError as e:
            raise ConfigError(f"model: {getattr(fn, '__qualname__', fn)} does not accept these settings ({e}); its "
                              f"signature: {_signature(fn)}.") from None
        masked = [d for d, k in self.padding.items() if k == "mask"]
        if masked:
            raise ConfigError(f"model.padding.{masked[0]}: 'mask' needs an apply(..., lengths=...) that masks beyond "
                              f"the true size, which a {self.framework} module does not take; use 'rows' or 'none'.")

    @property
    def source(self) -> Any:
        """What the build key hashes the source of: the user's class or function."""
        return self.target

    def inputs(self) -> dict[str, list]:
        return {n: list(s) for n, s in self._inputs.items()}

    def input_dtypes(self) -> dict[str, str]:
        return dict(self._dtypes)

    def input_values(self) -> dict[str, tuple[int, int]]:
        return dict(self._values)

    def example_inputs(self) -> list[Any]:
        """Zeros at each input's opt shape: what a Linen module is initialised with."""
        import jax.numpy as jnp

        out = []
        for name, shape in self._inputs.items():
            sizes = []
            for d in shape:
                value = self.dims.get(d, 1) if isinstance(d, str) else d
                sizes.append(value.opt if isinstance(value, NamedDimension) else int(value))
            out.append(jnp.zeros(sizes, to_dtype(self._dtypes[name])))
        return out

    def _construct(self, **extra: Any) -> Any:
        try:
            return self.target(**self.kwargs, **extra)
        except SETTING_ERRORS as e:
            raise refused(self.target_path, self.kwargs, e, _signature(self.target)) from None


class CallBinding:
    """How the config's inputs and ``call`` constants reach the module's ``__call__`` (or the function):
    by name where its signature names its parameters, else by position in ``model.inputs``' order.

    Checked when the model is loaded, before anything is traced: every input and every ``call`` key must
    name a parameter, and every parameter without a default must get one of them.
    """

    def __init__(self, fn: Any, name: str, inputs: list[str], constants: dict[str, Any]):
        self.name, self.inputs, self.constants = name, inputs, dict(constants)
        try:
            parameters = list(inspect.signature(fn).parameters.values()) if fn is not None else None
        except (TypeError, ValueError):
            parameters = None
        if parameters:  # a module's __call__ takes self first, a function model the params
            parameters = parameters[1:]
        kinds = inspect.Parameter
        named = [p for p in (parameters or []) if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)]
        self.positional = not named  # (*args, **kwargs) or a signature that cannot be read
        any_keyword = any(p.kind is kinds.VAR_KEYWORD for p in parameters or [])
        self.order = [p.name for p in named]
        self.positional_only = [p.name for p in named if p.kind is kinds.POSITIONAL_ONLY]
        listed = ", ".join(self.order) or "none"
        if not self.positional:
            for i in inputs:
                if i not in self.order and not any_keyword:
                    raise ConfigError(
                        f"model.inputs.{i}: {name} has no parameter {i!r} (its parameters: {listed}); inputs are "
                        "passed by name, so name each input as the call names its parameter.")
            for p in named:
                if p.default is kinds.empty and p.name not in inputs and p.name not in constants:
                    raise ConfigError(
                        f"model: {name} needs its parameter {p.name!r}, which is neither an input nor a constant: "
                        f"add it to model.inputs, or give it a value with `call: {{{p.name}: ...}}`.")
        for k in constants:
            if k in inputs:
                raise ConfigError(f"model.call.{k}: {k!r} is also an input; a parameter is an input or a constant.")
            if (self.positional or k not in self.order) and not any_keyword:
                raise ConfigError(f"model.call.{k}: {name} has no keyword parameter {k!r} (its parameters: {listed}).")
            if k in self.positional_only:
                raise ConfigError(f"model.call.{k}: {name} takes {k!r} by position only; it cannot be a constant.")

    def __call__(self, fn: Any, inputs: Any) -> Any:
        """``fn`` called with ``inputs`` (in ``model.inputs``' order) and the constants."""
        if self.positional:
            return fn(*inputs, **self.constants)
        values = dict(zip(self.inputs, inputs))
        args = [values.pop(n) for n in self.positional_only if n in values]
        return fn(*args, **values, **self.constants)


def _is_shape_error(err: Exception) -> bool:
    """Whether ``err`` reads like JAX refusing operands' shapes (what a module fed the wrong shape raises)."""
    text = str(err).lower()
    return isinstance(err, (TypeError, ValueError)) and any(
        w in text for w in ("shape", "dimension", "contracting", "incompatible", "broadcast", "rank"))


def _with_signature(fn: Any, names: list[str]) -> Any:
    """``fn(params, *inputs)`` as a function whose signature names the config's inputs (they name the
    executable's arguments)."""
    def apply(*args: Any) -> Any:
        return fn(*args)

    apply.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                             for n in names])
    return apply


def _signature(target: Any) -> str:
    """``Name(a, b, c=…)``: the parameter names, without the reprs of defaults."""
    try:
        params = list(inspect.signature(target.__init__ if inspect.isclass(target) else target).parameters.values())
    except (TypeError, ValueError):
        return "unknown"
    params = params[1:] if inspect.isclass(target) else params
    shown = [p.name + ("=…" if p.default is not inspect.Parameter.empty else "") for p in params
             if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    return f"{getattr(target, '__name__', target)}({', '.join(shown)})"


def _declared_inputs(cfg: dict[str, Any], target_path: str) -> dict[str, list]:
    inputs = cfg.get("inputs")
    if not inputs or not isinstance(inputs, dict):
        raise ConfigError(
            f"model.inputs: {target_path} does not declare its inputs, so the config must: e.g. "
            "`inputs: {x: [batch, 64]}` (each dim an int or a dim name that shapes.dims defines).")
    for name, shape in inputs.items():
        if not isinstance(shape, (list, tuple)) or not all(
                isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= 1) for d in shape):
            raise ConfigError(f"model.inputs.{name}: a shape is a list of positive ints and dim names, got {shape!r}.")
    return {n: list(s) for n, s in inputs.items()}


class NNXModel(LibraryModel):
    framework = "nnx"
    construct_with = {"rngs": None}

    def init(self, key: Any) -> Any:
        from flax import nnx

        module = self._construct(rngs=nnx.Rngs(key))
        if hasattr(module, "eval"):
            module.eval()  # deployment: dropout off, batch norm on its running statistics
        self._graph, self._rngs, params = nnx.split(module, nnx.RngState, ...)
        return params

    def _apply(self, params: Any, *inputs: Any) -> Any:
        from flax import nnx

        return self.call(nnx.merge(self._graph, _concrete(self._rngs), params), inputs)


def _concrete(rng_state: Any) -> Any:
    """RNG state with values left from an abstract ``init`` (``jax.eval_shape``, to restore a checkpoint)
    replaced by fixed ones: in eval mode no layer draws from them, but ``nnx.merge`` needs values."""
    import jax
    import jax.numpy as jnp

    def fill(x: Any) -> Any:
        if not isinstance(x, jax.core.Tracer):
            return x
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jnp.broadcast_to(jax.random.key(0), x.shape)
        return jnp.zeros(x.shape, x.dtype)

    return jax.tree_util.tree_map(fill, rng_state)


class LinenModel(LibraryModel):
    framework = "linen"

    def init(self, key: Any) -> Any:
        self._module = self._construct()
        return self.call(lambda *a, **k: self._module.init(key, *a, **k), self.example_inputs())

    def _apply(self, params: Any, *inputs: Any) -> Any:
        return self.call(lambda *a, **k: self._module.apply(params, *a, **k), inputs)


class EquinoxModel(LibraryModel):
    framework = "equinox"
    construct_with = {"key": None}

    def __init__(self, target: Any, target_path: str, kwargs: dict[str, Any], cfg: dict[str, Any],
                 dims: dict[str, Any]):
        self.vmap = cfg.get("vmap")
        super().__init__(target, target_path, kwargs, cfg, dims)
        if self.vmap is not None:
            axes = {n: [i for i, d in enumerate(s) if d == self.vmap] for n, s in self._inputs.items()}
            if not any(axes.values()) or any(len(a) > 1 for a in axes.values()):
                raise ConfigError(f"model.vmap: {self.vmap!r} must name a dim that appears once in some input's "
                                  f"shape (inputs: {self._inputs}).")
            self._in_axes = tuple(a[0] if a else None for a in axes.values())

    def init(self, key: Any) -> Any:
        import equinox as eqx

        module = self._construct(key=key)
        params, self._static = eqx.partition(module, eqx.is_array)
        return params

    def _apply(self, params: Any, *inputs: Any) -> Any:
        import equinox as eqx
        import jax

        module = eqx.combine(params, self._static)
        if self.vmap is None:
            return self.call(module, inputs)
        return jax.vmap(lambda *xs: self.call(module, xs), in_axes=self._in_axes)(*inputs)

    def likely_cause(self, err: Exception) -> str | None:
        first = next((d for shape in self._inputs.values() for d in shape[:1] if isinstance(d, str)), None)
        if self.vmap is None and first is not None and _is_shape_error(err):
            return (f"Equinox modules usually act on one example, and this one's layers saw the {first!r} dim: "
                    f"add `vmap: {first}` to the model config to map it over that dim.")
        return super().likely_cause(err)


class FunctionModel(LibraryModel):
    framework = "function"

    def __init__(self, target: Any, target_path: str, kwargs: dict[str, Any], cfg: dict[str, Any],
                 dims: dict[str, Any]):
        super().__init__(target, target_path, kwargs, cfg, dims)
        if not cfg.get("init"):
            raise ConfigError(f"model.init: {target_path} is a function, so the config names the function that "
                              "makes its params: `init: my_package.init` (called as init(key, **other keys)).")
        self._init = _import(cfg["init"], "model.init")
        self._check_settings(self._init, None)

    def _check_settings(self, fn: Any = None, *args: Any) -> None:
        if fn is not None:  # the function's settings go to its init, checked once it is imported
            super()._check_settings(fn, *args)

    def init(self, key: Any) -> Any:
        try:
            return self._init(key, **self.kwargs)
        except TypeError as e:
            raise ConfigError(f"model: {_signature(self._init)} does not accept these settings ({e}).") from None

    def _apply(self, params: Any, *inputs: Any) -> Any:
        return self.call(lambda *a, **k: self.target(params, *a, **k), inputs)
