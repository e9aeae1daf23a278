"""A Flax Linen stack of Dense layers, as any Linen user would write it.

Build it: ``python -m tripy_build --config-dir examples/conf model=linen_mlp`` (config: conf/model/linen_mlp.yaml).
"""

from typing import Sequence

import flax.linen as nn


class DenseStack(nn.Module):
    features: Sequence[int]

    @nn.compact
    def __call__(self, x):
        for width in self.features[:-1]:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.features[-1])(x)
