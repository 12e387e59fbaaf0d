"""Named remat policies: each gives the loss and gradients of no remat, keeps exactly the checkpoint names it lists
(never the attention scores), and recomputes the matmuls `parallel/cost.py` REMAT_RECOMPUTE says it does."""

import math
import re

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.models.config import tiny_config
from jaxwebrl.models.policy import init_params
from jaxwebrl.models import vision_layout
from jaxwebrl.models.attention import causal_mask
from jaxwebrl.models.decoder import DecoderLayer
from jaxwebrl.models.layers import REMAT_POLICIES, mrope_axis_selector, mrope_cos_sin, remat_policy
from jaxwebrl.models.qwen2_5_vl.vision import VisionBlock as Qwen25VisionBlock
from jaxwebrl.models.qwen3_vl.vision import VisionBlock as Qwen3VisionBlock
from jaxwebrl.models.vision_blocks import vision_rotary
from jaxwebrl.parallel import cost
from tests.models.test_policy import _batch, _loss_fn

NAMED = [p for p in REMAT_POLICIES if p != "none"]
QKV = {"text": {"query_proj", "key_proj", "value_proj"}, "vision": {"qkv_proj"}}
# what each policy keeps of a layer besides its input: its names that the layer's backward reads ("mlpwo" never is)
KEPT = {"minimal": {"qkv", "attention_out", "out_proj", "mlpwi"}, "save_dot_except_mlp": {"qkv", "attention_out",
        "out_proj"}, "save_qkv_proj": {"qkv"}, "save_out_proj": {"out_proj"}, "full": set()}
TOKENS = 12          # no other dimension of the tiny model is 12: a [.., 12, 12] residual is an attention score


def test_policies_are_ordered_by_recompute_and_costed():
    """REMAT_POLICIES runs from least recompute to most: the cost model's executed FLOPs rise along it."""
    assert set(cost.REMAT_RECOMPUTE) == set(REMAT_POLICIES) == {"none", *KEPT}
    config = tiny_config()
    flops = [cost.train_step(config.replace(remat=p), rows=2, seq_len=64, grids_per_row=[(1, 4, 4)], positions=8,
                             param_count=1, moments_dtype=None, devices=1).executed_flops for p in REMAT_POLICIES]
    assert all(a < b for a, b in zip(flops, flops[1:])), flops
    with pytest.raises(ValueError, match="remat='dots' is not a remat policy: use one of none, minimal"):
        remat_policy("dots")


@pytest.mark.parametrize("scan", [False, True])
def test_every_policy_gives_the_loss_and_gradients_of_no_remat(scan):
    config = tiny_config().replace(scan_layers=scan)
    module, params = init_params(config, seed=0)
    ids, mask, pixels, grid = _batch(config, np.random.RandomState(0))
    loss, grads = jax.jit(jax.value_and_grad(_loss_fn(module, grid)))(params, ids, mask, pixels)
    for policy in NAMED:
        remat_module, _ = init_params(config.replace(remat=policy), seed=0)
        loss_r, grads_r = jax.jit(jax.value_and_grad(_loss_fn(remat_module, grid)))(params, ids, mask, pixels)
        assert abs(float(loss_r) - float(loss)) <= 1e-6, policy
        for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_r)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, err_msg=policy)


def _layer(kind: str, policy: str):
    """(module under `policy`, its params, f(params, x) -> scalar) for one tiny decoder layer or vision block
    over TOKENS tokens / patches."""
    config = tiny_config()
    if kind == "text":
        c, block, b = config.text, DecoderLayer, 2
        x = jax.random.normal(jax.random.key(1), (b, TOKENS, c.hidden_size))
        positions = jnp.broadcast_to(jnp.arange(TOKENS)[None, None], (3, b, TOKENS))
        cos, sin = mrope_cos_sin(positions, c.head_dim, c.rope_theta,
                                 mrope_axis_selector(c.mrope_section, c.mrope_interleaved))
        extra = (cos, sin, causal_mask(jnp.ones((b, TOKENS), bool)))
    else:
        c, block = config.vision, Qwen3VisionBlock if kind == "vision" else Qwen25VisionBlock
        x = jax.random.normal(jax.random.key(1), (TOKENS, c.hidden_size))
        grid = np.array([[1, 3, 4]])          # one image of 12 patches
        cos, sin = vision_rotary(vision_layout.patch_positions(grid, 1), c.head_dim, c.rope_theta)
        extra = (cos, sin, vision_layout.segment_layout(vision_layout.frame_lengths(grid)))
    module = block(c) if policy == "none" else nn.remat(block, policy=remat_policy(policy))(c)
    params = module.init(jax.random.key(0), x, *extra)

    def f(p, x_):
        out = module.apply(p, x_, *extra)
        return jnp.sum(out[0] if isinstance(out, tuple) else out)

    return module, params, x, f


def _saved(f, *args, capsys) -> list[tuple[tuple[int, ...], str | None]]:
    """(shape, checkpoint name) of every residual `f`'s backward keeps besides its arguments and constants (the
    masks and rotary tables: no computed value goes unnamed)."""
    jax.ad_checkpoint.print_saved_residuals(f, *args)
    out = []
    for line in capsys.readouterr().out.splitlines():
        if " from the argument" in line or " from a constant" in line or " from a literal" in line:
            continue
        shape = tuple(int(d) for d in re.match(r"\w+\[([\d,]*)\]", line).group(1).split(",") if d)
        named = re.search(r"named '(\w+)'", line)
        out.append((shape, named.group(1) if named else None))
    return out


@pytest.mark.parametrize("kind", ["text", "vision", "vision_qwen2_5"])
def test_named_policies_keep_their_names_and_never_the_attention_scores(kind, capsys):
    qkv = QKV["text" if kind == "text" else "vision"]
    _, params, x, f = _layer(kind, "none")
    scores = [s for s, _ in _saved(f, params, x, capsys=capsys) if s[-2:] == (TOKENS, TOKENS)]
    assert scores, "without remat the softmax probabilities are kept: the score check below would see them"
    for policy in NAMED:
        _, params, x, f = _layer(kind, policy)
        saved = _saved(f, params, x, capsys=capsys)
        expected = set().union(*(qkv if n == "qkv" else {n} for n in KEPT[policy]))
        assert {n for _, n in saved} == expected, (policy, saved)
        assert not [s for s, _ in saved if s[-2:] == (TOKENS, TOKENS)], policy


def _dot_flops(jaxpr) -> float:
    """FLOPs of every dot_general in `jaxpr` and the jaxprs it calls (a scan's body counted `length` times)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
        times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jax.extend.core.Jaxpr):
                    total += times * _dot_flops(inner)
    return total


@pytest.mark.parametrize("kind", ["text", "vision", "vision_qwen2_5"])
def test_cost_rows_are_the_matmuls_each_policy_recomputes(kind):
    """The gradient's matmul FLOPs under a policy minus without remat = cost.remat_recompute's rows for one layer."""
    config = tiny_config()
    if kind == "vision_qwen2_5":     # SwiGLU: gate and up are the MLP's input matmuls
        config = config.replace(model_type="qwen2_5_vl")
    grad_flops = {}
    for policy in REMAT_POLICIES:
        _, params, x, f = _layer(kind, policy)
        grad_flops[policy] = _dot_flops(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(params, x).jaxpr)
    for policy in NAMED:
        text, vision, attention_share = cost.remat_recompute(config.replace(remat=policy), tokens=2 * TOKENS,
                                                             patches=TOKENS)
        if kind == "text":
            t = config.text
            expected = text / t.num_layers + attention_share * 4 * t.num_heads * t.head_dim * 2 * TOKENS * TOKENS
        else:
            expected = vision / config.vision.depth + attention_share * 4 * config.vision.hidden_size * TOKENS ** 2
        assert grad_flops[policy] - grad_flops["none"] == pytest.approx(expected), policy
