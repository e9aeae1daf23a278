"""Mixtures of experts (``models/moe.py``): the routed experts against every expert run on every token.

``routed`` sorts the picks by expert, pads each expert's picks to blocks and loops over the blocks used; here its
output is compared with the plain sum of the picked experts' outputs, for a token alone, many tokens whose picks
fill several blocks of one expert, experts no token picks, and an exported program whose token count is
symbolic (a branch per block size). Hugging Face parity of whole models (Qwen3-MoE,
Qwen2-MoE, Mixtral) and a generate build are in ``test_llama.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tripy_build.models import MODELS
from tripy_build.models.moe import Mixtral, Qwen3Moe, block_rows, route, routed


def dense(x, weights, picks, gate_up, down):
    """Each token's picked experts run one by one, their outputs summed by the weights."""
    ff = down.shape[2]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t], picks[t]):
            gu = gate_up[e] @ x[t]
            out[t] += w * (down[e] @ (np.asarray(jax.nn.silu(gu[:ff])) * gu[ff:]))
    return out


def problem(tokens, experts, k, banned, d=12, ff=10):
    """Tokens, their router's picks (no token picks a ``banned`` expert) and the experts' weights."""
    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    logits[:, list(banned)] = -1e9
    gate_up = rng.standard_normal((experts, 2 * ff, d)).astype(np.float32)
    down = rng.standard_normal((experts, d, ff)).astype(np.float32)
    weights, picks = (np.asarray(a) for a in route(jnp.asarray(logits), k, normalize=False))
    assert not set(picks.ravel()) & set(banned)
    return x, weights, picks, gate_up, down


# a token alone; many tokens over a few experts (the others banned: each used expert's picks fill several blocks);
# picks spread over every expert
@pytest.mark.parametrize("tokens, experts, k, banned", [(1, 8, 2, ()), (200, 8, 2, (1, 2, 3, 4, 5, 6)),
                                                        (50, 6, 3, (5,)), (40, 4, 1, (0, 2))])
def test_routed_experts_equal_each_picked_expert_run_alone(tokens, experts, k, banned):
    args = problem(tokens, experts, k, banned)
    got = jax.jit(lambda *a: routed(*a, lambda gate, up: jax.nn.silu(gate) * up))(*args)
    np.testing.assert_allclose(np.asarray(got), dense(*args), rtol=1e-5, atol=1e-4)
    if tokens == 200:
        assert np.bincount(args[2].ravel()).max() > block_rows(tokens * k, experts)


def test_an_exported_program_with_symbolic_tokens_picks_each_shapes_block_size():
    """Exported with the token count symbolic (as a build exports), every block size is a branch; called at each
    shape, the result is the concrete path's, whichever block size that shape picks."""
    n = jax.export.symbolic_shape("n")[0]
    d, ff, experts, k = 12, 10, 6, 3
    spec = [jax.ShapeDtypeStruct((n, d), jnp.float32), jax.ShapeDtypeStruct((n, k), jnp.float32),
            jax.ShapeDtypeStruct((n, k), jnp.int32), jax.ShapeDtypeStruct((experts, 2 * ff, d), jnp.float32),
            jax.ShapeDtypeStruct((experts, d, ff), jnp.float32)]
    exported = jax.export.export(jax.jit(lambda *a: routed(*a, lambda gate, up: jax.nn.silu(gate) * up)))(*spec)
    assert [block_rows(t * k, experts) for t in (1, 12, 50)] == [8, 16, 64]
    for tokens in (1, 12, 50):
        args = problem(tokens, experts, k, ())
        np.testing.assert_allclose(np.asarray(exported.call(*args)), dense(*args), rtol=1e-5, atol=1e-4)


def test_route_picks_the_softmaxs_largest_renormalised_where_asked():
    logits = jnp.asarray([[0.0, 2.0, 1.0, -1.0]])
    probs = np.asarray(jax.nn.softmax(logits))[0]
    weights, picks = route(logits, 2, normalize=False)
    assert picks.tolist() == [[1, 2]] and np.allclose(weights, [probs[[1, 2]]])
    weights, _ = route(logits, 2, normalize=True)
    assert np.allclose(weights, [probs[[1, 2]] / probs[[1, 2]].sum()])


def test_sparse_layers_follow_hugging_faces_rule_and_bad_settings_are_refused():
    small = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=4, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    model = Qwen3Moe(**small, decoder_sparse_step=2, mlp_only_layers=[3])
    assert [model.sparse(i) for i in range(4)] == [False, True, False, False]
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    assert ["router" in p for p in params["layers"]] == [False, True, False, False]
    assert len(params["layers"][1]["experts"]) == 4 and params["layers"][1]["experts"][0]["down"]["weight"].shape == (16, 8)
    assert params["layers"][0]["gate"]["weight"].shape == (24, 16)  # a dense layer: intermediate_size
    assert Mixtral(**{**small, "moe_intermediate_size": None}).expert_size() == 24  # Mixtral's experts: intermediate_size
    assert MODELS["qwen3_moe"] is Qwen3Moe and MODELS["mixtral"] is Mixtral
    with pytest.raises(ValueError, match=r"num_experts_per_tok=5 must be in \[1, num_experts=4\]"):
        Qwen3Moe(**{**small, "num_experts_per_tok": 5})
    with pytest.raises(ValueError, match="decoder_sparse_step=0 must be at least 1"):
        Qwen3Moe(**small, decoder_sparse_step=0)
