"""A plain-JAX bag-of-embeddings classifier as two functions: integer ids in, a gather on the weights.

Build it: ``python -m tripy_build --config-dir examples/conf model=embedding`` (config: conf/model/embedding.yaml).
"""

import jax
import jax.numpy as jnp


def init(key, vocab: int, width: int, classes: int):
    k1, k2 = jax.random.split(key)
    return {"emb": jax.random.normal(k1, (vocab, width)) * 0.1,
            "out": jax.random.normal(k2, (width, classes)) * width ** -0.5}


def apply(params, ids):
    return jnp.mean(params["emb"][ids], axis=1) @ params["out"]
