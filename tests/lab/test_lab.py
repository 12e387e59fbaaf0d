"""The lab at its smallest size: the environment's rules, a few updates of paired arms, and the proof that its
step normaliser is the rl/ library's own (k -> 2k halves the gradient; 1/|τ| and 1/k match a NumPy reference)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.lab import env as env_lib
from jaxwebrl.lab import oracle, recipes, rollout, run, update
from jaxwebrl.lab.policy import PolicyConfig, init_params

ENV = env_lib.EnvConfig(lengths=(2, 4), length_weights=(1.0, 1.0), failure_success_ratio=2.0, n_buttons=2,
                        n_clues=2, memory_symbols=2, memory_slots=2)
POLICY = PolicyConfig(width=8, layers=1, heads=1, mlp=8)


def setup_for(arm, **actor):
    return update.Setup(env=ENV, policy=POLICY, recipe=recipes.lab_recipe(arm, gen_slots=ENV.gen_slots, actor=actor),
                        n_groups=3, group_size=4, warm_start_steps=2)


@functools.partial(jax.jit, static_argnums=(0, 2))
def oracle_rows(epsilon, key=0, n_groups=3):
    def choose(state, prompt, k):
        generated, kinds = oracle.act(ENV, state, k, epsilon=epsilon)
        return generated, kinds, jnp.zeros(generated.shape, jnp.float32)
    return rollout.play(ENV, choose, jax.random.PRNGKey(key), n_groups=n_groups, group_size=4)


def test_environment_rules():
    rows = oracle_rows(0.0, 0, 8)
    assert bool(rows.success.all())                              # a perfect player always succeeds ...
    lengths = np.asarray(rows.steps)
    assert set(lengths) <= set(ENV.lengths) and len(set(lengths)) == 2   # ... in exactly L steps
    prompt = np.asarray(rows.prompt).reshape(32, ENV.max_horizon, -1)
    assert (prompt[:, 0, 0] >= ENV.clue0).all() and (prompt[:, 1:, 0] == env_lib.BLANK).all()   # clue at step 0 only
    assert ENV.horizons == (4, 8)
    random = oracle_rows(1.0, key=3)
    failed = ~np.asarray(random.success)
    assert failed.any() and (np.asarray(random.steps)[failed] <= np.asarray(random.horizon)[failed]).all()
    with pytest.raises(ValueError, match="failure_success_ratio"):
        env_lib.EnvConfig(failure_success_ratio=0.5)


def numpy_step_advantages(rows, k):
    """r̂_e (group mean / population std, eps 1e-5) divided by k, or by |τ_e| when k is None, on each real row."""
    active = np.asarray(rows.active)
    reward = np.asarray(rows.success, np.float64)
    group = np.arange(reward.size) // 4
    r_hat = np.zeros_like(reward)
    for g in np.unique(group):
        r = reward[group == g]
        r_hat[group == g] = (r - r.mean()) / (r.std() + 1e-5)
    steps = np.asarray(rows.steps, np.float64)
    per_episode = r_hat / (steps if k is None else k)
    return np.where(active, np.repeat(per_episode, ENV.max_horizon), 0.0)


def test_step_normaliser_is_the_rl_library_own():
    rows = oracle_rows(0.5, key=7)
    success, steps = np.asarray(rows.success).reshape(3, 4), np.asarray(rows.steps)
    assert (success.any(1) & ~success.all(1)).any() and len(set(steps)) > 2   # mixed groups, varied |τ|
    params = init_params(ENV, POLICY, jax.random.PRNGKey(0))
    base = setup_for("constT10")
    rows = rows._replace(behave_logprobs=update.rows_logprobs(base, params, rows))
    mask = np.asarray(rows.loss_mask)
    for arm, k in (("constT10", 10.0), ("grpo", None)):
        adv = np.asarray(update.token_advantages(setup_for(arm), rows))
        expected = numpy_step_advantages(rows, k)[:, None] * mask
        np.testing.assert_allclose(adv, expected, rtol=1e-4, atol=1e-7)

    @functools.partial(jax.jit, static_argnums=0)
    def grads(setup):
        adv = update.token_advantages(setup, rows)
        return jax.grad(lambda p: update.policy_loss(setup, p, rows, adv, rows.behave_logprobs)[0])(params)

    flat = [np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(grads(s))])
            for s in (base, setup_for("constT10", step_adv_const_length=20.0))]
    assert np.abs(flat[0]).max() > 1e-6
    np.testing.assert_allclose(flat[1], 0.5 * flat[0], rtol=1e-4, atol=1e-9)


@jax.jit
def rows_with_time_outs():
    """Oracle rows (ε = 0.5) where the episodes of clue 0 never answer, so they run to their horizon; and one
    episode that answers, wrongly, at its horizon's step (it ended by its answer, not by a time-out)."""
    def choose(state, prompt, k):
        generated, kinds = oracle.act(ENV, state, k, epsilon=0.5)
        answer = (kinds == env_lib.KIND_ACTION) & (generated >= ENV.answer0) & (state.clue[:, None] == 0)
        return jnp.where(answer, ENV.press0, generated), kinds, jnp.zeros(generated.shape, jnp.float32)
    return rollout.play(ENV, choose, jax.random.PRNGKey(4), n_groups=4, group_size=4)


def test_measures_are_taken_over_the_right_episodes_and_rows():
    """The study's measures against NumPy from the episodes alone: steps over successes / failures, time-outs among
    failures (ended by the horizon, not by an answer), memory tokens over real steps only (not padding), the
    failures' share of |advantage| weight."""
    rows = rows_with_time_outs()
    success, steps, horizon = (np.asarray(x) for x in (rows.success, rows.steps, rows.horizon))
    generated = np.asarray(rows.generated).reshape(steps.size, ENV.max_horizon, -1)
    real = np.arange(ENV.max_horizon)[None] < steps[:, None]
    memory = ((generated >= ENV.memory0) & (generated < ENV.press0)).sum(-1)
    kinds = np.asarray(rows.slot_kinds).reshape(generated.shape)
    last_action = np.where(kinds == env_lib.KIND_ACTION, generated, 0)[np.arange(steps.size), steps - 1].max(-1)
    answered = last_action >= ENV.answer0
    timed_out = (steps >= horizon) & ~answered       # the horizon ended it, not an answer
    assert (timed_out & ~success).any() and (~timed_out & ~success).any() and success.any()
    assert (answered & ~success & (steps >= horizon)).any()   # a wrong answer on the horizon's step
    assert (memory[~real] > 0).any()                 # padding steps wrote memory too: they must not count
    curves = {k: float(v) for k, v in run.batch_curves(rows).items()}
    expected = {"success": success.mean(), "success_steps": steps[success].mean(),
                "failure_steps": steps[~success].mean(), "failure_timeout_share": timed_out[~success].mean(),
                "memory_tokens": memory[real].mean()}
    for name, value in expected.items():
        assert curves[name] == pytest.approx(value, rel=1e-6), name
    failed_rows = np.repeat(~success, ENV.max_horizon)
    for arm in ("constT10", "grpo"):
        setup = setup_for(arm)
        advantages = update.token_advantages(setup, rows)
        weight = np.abs(np.asarray(advantages))
        assert weight[failed_rows].sum() > 0 and weight[~failed_rows].sum() > 0
        share = float(update.failure_weight_share(setup, rows, advantages))
        assert share == pytest.approx(weight[failed_rows].sum() / weight.sum(), rel=1e-5), arm


@pytest.mark.slow   # two compiles of the whole update program: ~60 s on the loaded 2-core machine
def test_paired_arms_train_a_few_updates():
    seeds = jnp.arange(2)
    start = run.init(setup_for("grpo"), seeds)     # arm-free: one warm start serves every arm of a seed
    curves = {}
    for arm in ("constT10", "grpo"):
        setup = setup_for(arm)
        _, curves[arm] = run.train(setup, start, seeds, 0, 2)
        assert set(curves[arm]) == set(run.CURVES)
        for name, values in curves[arm].items():
            assert values.shape == (2, 2), name
        assert np.isfinite(np.asarray(curves[arm]["clip_ratio"])).all()
    # paired: the same seed's arms play their first batch with the same weights and draws
    np.testing.assert_array_equal(curves["constT10"]["success"][:, 0], curves["grpo"]["success"][:, 0])
    np.testing.assert_array_equal(curves["constT10"]["memory_tokens"][:, 0], curves["grpo"]["memory_tokens"][:, 0])


def test_recipes_come_from_configs():
    assert recipes.lab_recipe("constT10", gen_slots=4).advantage.step_adv_const_length == 10.0
    assert recipes.lab_recipe("grpo", gen_slots=4).advantage.step_adv_const_length is None
    dr = recipes.lab_recipe("drgrpo", gen_slots=4)
    assert dr.agg_mode == "seq-mean-token-sum-norm" and dr.agg_normalizer == 4.0
    with pytest.raises(ValueError, match="no field"):
        recipes.lab_recipe("grpo", gen_slots=4, actor={"no_such_knob": 1})


@pytest.mark.slow   # one compile of the update program
def test_policy_lag_plays_the_oldest_params_and_weights_by_behaviour():
    setup = dataclasses.replace(setup_for("grpo"), lag=1)
    old = init_params(ENV, POLICY, jax.random.PRNGKey(1))
    new = init_params(ENV, POLICY, jax.random.PRNGKey(2))
    opt_state = setup.optimizer().init(new)

    def state_with(history):
        return run.RunState(new, opt_state, jax.tree_util.tree_map(lambda *x: jnp.stack(x), *history))

    step = jax.jit(functools.partial(run._update_one, setup, 0))
    (after, a), (_, b), (_, c) = (step(state_with(h), 0) for h in ((old, new), (old, old), (new, old)))
    assert float(a["memory_tokens"]) == float(b["memory_tokens"])   # the batch was played by history[0] ...
    assert float(a["memory_tokens"]) != float(c["memory_tokens"])   # ... not by the newest params
    trained = jax.tree_util.tree_leaves(after.history)
    np.testing.assert_array_equal(trained[0][0], jax.tree_util.tree_leaves(new)[0])   # pushed: [new, updated]
