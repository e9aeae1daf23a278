"""A Flax NNX MLP, written as any NNX user would: no tripy_build code in it.

Build it: ``python -m tripy_build --config-dir examples/conf model=nnx_mlp`` (config: conf/model/nnx_mlp.yaml).
"""

from flax import nnx


class MLP(nnx.Module):
    def __init__(self, din: int, hidden: int, dout: int, dropout: float, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(din, hidden, rngs=rngs)
        self.norm = nnx.LayerNorm(hidden, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)  # off in the build: modules are built in eval mode
        self.fc2 = nnx.Linear(hidden, dout, rngs=rngs)

    def __call__(self, x):
        return self.fc2(self.dropout(nnx.gelu(self.norm(self.fc1(x)))))
