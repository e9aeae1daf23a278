"""MLServer's side of ``bench/serve.py``: a custom runtime serving a zoo model's ``apply`` under ``jax.jit``.

What a hand-written MLServer runtime for a JAX model does: the weights ``bench/serve.py`` wrote (one .npz,
``arr_i`` in ``jax.tree_util.tree_leaves`` order) put on the device once, each request decoded with
MLServer's ``NumpyCodec`` and run through ``jax.jit(model.apply)``. MLServer's adaptive batching
(``max_batch_size``/``max_batch_time`` in model-settings.json) hands ``predict`` the merged rows.

The model-settings' ``parameters.extra``: ``class`` and ``kwargs`` (the zoo model, imported from this
repository's ``tripy_build.models``, which needs only jax), ``width`` (the input's last dim), ``max_batch``
(the most rows one call takes: tripy_build's artifact declares the same bound; a larger request is a 400
rather than minutes of compute) and ``output`` (the output's name, as tripy_build names it). Every batch
size from 1 to ``max_batch`` is compiled in ``load``, before the server reports ready, as tripy_build
warms every profile before its port opens.
"""

from __future__ import annotations

import jax
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse


class JaxModel(MLModel):
    async def load(self) -> bool:
        import tripy_build.models as zoo

        extra = self.settings.parameters.extra
        model = getattr(zoo, extra["class"])(**extra["kwargs"])
        template = model.init(jax.random.PRNGKey(0))
        with np.load(self.settings.parameters.uri) as data:
            leaves = [data[f"arr_{i}"] for i in range(len(data.files))]
        self._params = jax.device_put(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves))
        self._apply = jax.jit(model.apply)
        self._width, self._max_batch, self._output = int(extra["width"]), int(extra["max_batch"]), extra["output"]
        for n in range(1, self._max_batch + 1):
            self._apply(self._params, np.zeros((n, self._width), np.float32)).block_until_ready()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        if x.ndim != 2 or x.shape[1] != self._width or not 1 <= x.shape[0] <= self._max_batch:
            raise InferenceError(f"x: shape {list(x.shape)}; this model takes [1..{self._max_batch}, {self._width}].")
        y = np.asarray(self._apply(self._params, x.astype(np.float32, copy=False)))
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(self._output, y)])
