"""The jitted update on the tiny Qwen3-VL policy and real toy episodes: proximal log-probs, advantages, updates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.constT10 import get_config
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.models.sampler import Sampler, SamplingParams, TokenConstraint
from jaxwebrl.train import rl_config
from jaxwebrl.train.assembly import UpdateBatch, assemble, row_bucket
from jaxwebrl.models import lm_head
from jaxwebrl.rl import advantages as adv_lib
from jaxwebrl.train.update import LOGPROB_FLOOR, OptimizerConfig, Updater, UpdateSettings
from jaxwebrl.parallel import distributed, partition
from jaxwebrl.parallel import mesh as mesh_lib
from tests.scale.train_steps import synthetic_episodes
from tests.train.conftest import assert_on_partition_rules, play_toy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


@pytest.fixture(scope="module")
def updater(policy):
    """One updater for the module: its jitted minibatch step compiles once for the shared batch shape."""
    config = get_config("toy")
    config.train.ppo_n_minibatches, config.train.ppo_n_epochs = 2, 3   # several minibatches and epochs per batch
    return updater_for(policy, config)


def updater_for(policy, config):
    """The run's Updater for `config`, through rl_config as the trainer builds it (a 10-step schedule)."""
    config.train.max_steps = 10
    updater = Updater(policy.module, rl_config.update_settings(config), rl_config.optimizer_settings(config))
    return updater, updater.optimizer


def test_update_moves_success_up_and_failure_down(policy, updater, toy_buffer):
    play_toy(toy_buffer, groups=2, group_size=4, epsilon=0.6, seed=3)
    episodes, _ = toy_buffer.read(None, group_size=4)
    rewards = [e.reward for e in episodes]
    assert 0 < sum(rewards) < len(rewards)  # mixed outcomes, so advantages are not all zero
    batch = assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                     n_minibatches=2, max_seq_len=512)
    updater, tx = updater
    params = jax.tree.map(lambda x: x.copy(), policy.params)
    before = updater.proximal_logprobs(params, batch)

    # the proximal log-probs are the Policy's own teacher-forced log-probs (same forward, same images) on the
    # tokens that carry loss (the LM head runs there only; 0 elsewhere)
    shown = batch.image_index[:2, 0]                   # window 0: one distinct screenshot of 16 patches a row
    pixels = np.concatenate([batch.pixel_values[16 * i:16 * (i + 1)] for i in shown])
    logits = policy.logits(batch.input_ids[:2], batch.attention_mask[:2], pixels, batch.image_grid_thw[shown])
    lp = jax.nn.log_softmax(np.asarray(logits)[:, :-1], -1)
    manual = np.take_along_axis(lp, batch.input_ids[:2, 1:, None], -1)[..., 0]
    on_loss = batch.loss_mask[:2, 1:] > 0
    np.testing.assert_allclose(before[:2, 1:][on_loss], manual[on_loss], atol=2e-5)
    assert (before[:2, 1:][~on_loss] == 0).all()

    new_params, _, stats = updater(params, tx.init(params), batch)
    assert stats["optimizer_updates"] == 6 and np.isfinite(stats["actor_loss"])
    for key in ("clip_ratio", "dual_clip_ratio", "behave_cap_ratio"):
        assert 0.0 <= stats[f"loss_stats/{key}"] <= 1.0
    after = updater.proximal_logprobs(new_params, batch)
    n = batch.num_real_rows
    mask = batch.loss_mask[:n].astype(bool)
    delta = (after - before)[:n]
    won = np.array([e.reward > 0 for e in episodes for _ in e.steps])   # per row: rows are the steps in order
    success_shift = delta[won][mask[won]].mean()
    failure_shift = delta[~won][mask[~won]].mean()
    assert success_shift > failure_shift, (success_shift, failure_shift)


def test_update_is_deterministic(policy, updater, toy_buffer):
    play_toy(toy_buffer, groups=2, group_size=4, epsilon=0.6, seed=3)
    episodes, _ = toy_buffer.read(None, group_size=4)
    batch = assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                        n_minibatches=2, max_seq_len=512)
    updater, tx = updater
    outs = []
    for _ in range(2):
        params = jax.tree.map(lambda x: x.copy(), policy.params)
        outs.append(updater(params, tx.init(params), batch)[0])
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_one_minibatch_update_reads_the_proximal_log_probs_off_its_own_forward(policy, toy_buffer, monkeypatch):
    """ppo_n_minibatches = ppo_n_epochs = 1 and no reference: π_prox is the params the one update starts from, so
    the step makes no separate proximal pass and gives the update of the two-pass step (its log-probs passed in)."""
    play_toy(toy_buffer, groups=2, group_size=4, epsilon=0.6, seed=3)
    episodes, _ = toy_buffer.read(None, group_size=4)
    batch = assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                     n_minibatches=1, max_seq_len=512)
    config = get_config("toy")
    config.train.ppo_n_minibatches, config.train.ppo_n_epochs = 1, 1
    updater, tx = updater_for(policy, config)
    proximal_passes = []
    forward = updater._logprobs
    monkeypatch.setattr(updater, "_logprobs", lambda *a, **k: proximal_passes.append(1) or forward(*a, **k))

    def update():
        params = jax.tree.map(lambda x: x.copy(), policy.params)
        return updater(params, tx.init(params), batch)

    own, _, own_stats = update()
    assert not proximal_passes and own_stats["optimizer_updates"] == 1 and own_stats["approx_kl_abs"] == 0
    monkeypatch.setattr(updater, "_own_prox", lambda minibatches: False)   # the two-pass step
    two_pass, _, stats = update()
    assert len(proximal_passes) == 1 and 0 <= stats["approx_kl_abs"] < 1e-5
    for key in ("actor_loss", "grad_norm", "loss_stats/clip_ratio", "loss_stats/behave_cap_ratio"):
        assert own_stats[key] == pytest.approx(stats[key], rel=1e-4, abs=1e-6), key
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(policy.params)))
    assert moved > 1e-4   # the update moved the weights, so the comparison below is of an update
    for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(two_pass)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)


def _sharpened(policy):
    """The tiny policy with its embeddings ×4: peaked enough that top-p 0.9 cuts real mass off."""
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * 4.0 if "embedding" in jax.tree_util.keystr(path) else x, policy.params)
    return policy.replace_params(params)


def _sampled_batch(prompts, results, n_minibatches, constraint=None):
    """An UpdateBatch of one row per generation (prompt + sampled tokens), behaviour log-probs as recorded."""
    rows = [np.concatenate([p["input_ids"], r.tokens]) for p, r in zip(prompts, results)]
    n, width = len(rows), 64
    B = row_bucket(n, n_minibatches)
    ids, attention, mask = (np.zeros((B, width), np.int32) for _ in range(3))
    behave = np.zeros((B, width), np.float32)
    for i, (prompt, result, row) in enumerate(zip(prompts, results, rows)):
        start = len(prompt["input_ids"])
        ids[i, :len(row)], attention[i, :len(row)], mask[i, start:len(row)] = row, 1, 1
        behave[i, start:len(row)] = result.logprobs
    attention[n:, 0] = 1
    with_images = [p for p in prompts if len(p["image_grid_thw"])]
    states = decisions = None
    if constraint is not None:
        states, admitted = constraint.replay(ids, mask)
        decisions = constraint.decision_mask(states, mask, admitted)
    return UpdateBatch(
        input_ids=ids, attention_mask=attention, loss_mask=mask, behave_logprobs=behave,
        rewards=np.zeros(n, np.float32), episode_ids=np.arange(n), group_ids=np.zeros(n, np.int64), num_real_rows=n,
        pixel_values=np.concatenate([p["pixel_values"] for p in with_images]),
        image_grid_thw=np.concatenate([p["image_grid_thw"] for p in with_images]),
        image_index=_one_image_a_row([len(p["image_grid_thw"]) > 0 for p in prompts], B),
        constraint_states=states, decision_mask=decisions)


def _one_image_a_row(has_image: list[bool], rows: int) -> np.ndarray:
    """[rows, 1] int32 image_index of rows showing at most one image each, the images in row order (-1: none)."""
    index = np.full((rows, 1), -1, np.int32)
    index[np.flatnonzero(has_image), 0] = np.arange(sum(has_image))
    return index


def test_trainer_replays_temperature_top_p_and_top_k_exactly(policy):
    """Sampled at temperature 0.7 and top-p 0.9 (then with top-k 20 and the action grammar too), the trainer's
    recomputed log-probs equal the sampler's recorded ones to 1e-5: both are log-probs of the tempered, truncated
    distribution. Replaying at temperature 1 (the old trainer) or without the truncation is visibly off."""
    sharp = _sharpened(policy)
    processor = sharp.processor
    image = np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8)
    prompts = [processor.encode("<|vision_start|><|image_pad|><|vision_end|>click OK", [image]),
               processor.encode("<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n"),
               processor.encode("<|vision_start|><|image_pad|><|vision_end|>next", [image[::-1]]),
               processor.encode("a longer prompt, y")]
    tokenizer = processor.tokenizer
    end = tokenizer.token_to_id("<|im_end|>")
    actions = ["click(250, 500)", "click(750, 500)", "click(75, 80)", "go_back()"]
    grammar = TokenConstraint.from_token_sequences([tokenizer.encode(a).tolist() for a in actions],
                                                   tokenizer.vocab_size, end)
    cases = [(SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9), None),
             (SamplingParams(max_new_tokens=12, temperature=0.7, top_k=20, top_p=0.9, stop_token_ids=(end,)), grammar)]
    optimizer = OptimizerConfig(lr=1e-3, total_steps=1)
    for sampling, constraint in cases:
        sampler = Sampler(sharp.module, sharp.config, pad_token_id=tokenizer.pad_token_id, decode_chunk=4,
                          prompt_multiple=32, constraint=constraint)
        results = sampler.generate((sharp.params, 0), prompts * 2, sampling, seed=5)
        batch = _sampled_batch(prompts * 2, results, n_minibatches=2, constraint=constraint)
        allowed = None if constraint is None else constraint.allowed
        policy_tokens = batch.loss_mask.astype(bool)

        def replay(**transform):
            settings = UpdateSettings(n_minibatches=2, n_epochs=1, **transform)
            return Updater(sharp.module, settings, optimizer, allowed_table=allowed).proximal_logprobs(sharp.params, batch)

        same = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
        recomputed = replay(**same)
        np.testing.assert_allclose(recomputed[policy_tokens], batch.behave_logprobs[policy_tokens], atol=1e-5, rtol=0)
        free = batch.objective_mask.astype(bool)
        assert np.abs(replay()[free] - batch.behave_logprobs[free]).max() > 0.05               # temperature 1
        untruncated = replay(temperature=sampling.temperature)
        assert np.abs(untruncated[free] - batch.behave_logprobs[free]).max() > 1e-3             # no top-k/top-p


def test_minibatches_are_balanced_by_policy_tokens(policy, updater, toy_buffer):
    """Real toy rows split into 2 minibatches of equal row count whose policy-token counts differ by at most one
    row's (the greedy bound), every row exactly once, the images following their rows."""
    play_toy(toy_buffer, groups=2, group_size=4, epsilon=0.6, seed=4)
    episodes, _ = toy_buffer.read(None, group_size=4)
    batch = assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                        n_minibatches=2, max_seq_len=512)
    updater, _ = updater
    minibatches = updater._split(batch)
    tokens = [m.policy_tokens for m in minibatches]
    assert len(minibatches) == 2 and min(tokens) > 0
    assert max(tokens) - min(tokens) <= batch.loss_mask.sum(axis=1).max()
    np.testing.assert_array_equal(np.sort(np.concatenate([m.rows for m in minibatches])), np.arange(len(batch.input_ids)))
    for m in minibatches:
        np.testing.assert_array_equal(np.asarray(m.minibatch.input_ids), batch.input_ids[m.rows])
        index = np.asarray(m.minibatch.image_index)            # the rows' images, as indices into the minibatch's
        shown = batch.image_index[m.rows]
        assert (index[shown < 0] == -1).all() and len(m.grid) >= index.max() + 1
        assert m.minibatch.pixel_values.shape[0] == sum(np.prod(g) for g in m.grid)
        for row, k in zip(*np.nonzero(shown >= 0)):            # every image index points at that row's pixels
            u, local = shown[row, k], index[row, k]
            np.testing.assert_array_equal(np.asarray(m.minibatch.pixel_values)[16 * local:16 * (local + 1)],
                                          batch.pixel_values[16 * u:16 * (u + 1)])


def test_a_minibatch_without_policy_tokens_takes_no_step(policy, updater, toy_buffer):
    """One row carries loss and there are 2 minibatches: the other gets no forward and no AdamW step (its zero
    gradient would still move the weights through weight decay and the moments), so the result equals one
    minibatch holding every row."""
    play_toy(toy_buffer, groups=1, group_size=4, epsilon=0.6, seed=3)
    episodes, _ = toy_buffer.read(None, group_size=4)
    batch = assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                        n_minibatches=2, max_seq_len=512)
    only = np.zeros_like(batch.loss_mask)
    only[0] = batch.loss_mask[0]
    won = batch.episode_ids == batch.episode_ids[0]           # row 0's episode succeeds, the group's others fail
    one_row = batch._replace(loss_mask=only, rewards=won.astype(np.float32))
    config = get_config("toy")
    config.train.lr, config.train.weight_decay, config.train.ppo_n_epochs = 1e-3, 0.1, 2
    outs = []
    for n_minibatches in (2, 1):
        config.train.ppo_n_minibatches = n_minibatches
        step, _ = updater_for(policy, config)
        params = jax.tree.map(lambda x: x.copy(), policy.params)
        outs.append(step(params, step.optimizer.init(params), one_row))
    (split_params, _, split_stats), (whole_params, _, whole_stats) = outs
    assert split_stats["optimizer_updates"] == whole_stats["optimizer_updates"] == 2
    assert split_stats["policy_tokens"] == whole_stats["policy_tokens"] == only.sum()
    for x, y, p in zip(jax.tree.leaves(split_params), jax.tree.leaves(whole_params), jax.tree.leaves(policy.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=2e-6)   # an extra step: ~1e-3
    moved = max(float(np.abs(np.asarray(x) - np.asarray(p)).max())
                for x, p in zip(jax.tree.leaves(split_params), jax.tree.leaves(policy.params)))
    assert moved > 1e-4


def test_a_token_outside_the_truncated_set_gets_the_floor_and_no_gradient():
    """The weights moved since sampling and the sampled token left the top-k set: under the truncated policy its
    probability is 0, so its replayed log-prob is LOGPROB_FLOOR (ratio and weight 0) with no gradient; tokens inside
    keep the renormalised log-prob and its gradient."""
    logits = jnp.log(jnp.array([[[0.5, 0.3, 0.15, 0.05]] * 3], jnp.float32))      # [1, 3, 4]
    ids = jnp.array([[0, 3, 1]])                                                    # token 3 is outside the top 2
    eye = jnp.eye(4, dtype=jnp.float32)                   # head weight [V, E] = I: the hidden states are the logits

    def replay(x, **kw):
        return lm_head.token_logprobs(x, eye, ids, compute_dtype=jnp.float32, temperature=1.0, **kw)[0]

    lp = replay(logits, top_k=2)
    np.testing.assert_allclose(lp, [[0.0, LOGPROB_FLOOR, np.log(0.3 / 0.8)]], rtol=1e-6)
    grad = jax.grad(lambda x: replay(x, top_k=2).sum())(logits)
    assert np.all(np.asarray(grad[0, 0]) == 0.0)                                   # predicts the floored token
    assert np.abs(np.asarray(grad[0, 1])).sum() > 0
    np.testing.assert_allclose(replay(logits), jnp.log(jnp.array([[1.0, 0.05, 0.3]])).at[0, 0].set(0),
                               rtol=1e-6)                                          # no truncation: no floor


def test_batches_of_one_row_bucket_share_one_compiled_program(policy, toy_buffer):
    """Real-row counts vary from step to step (episodes end early, env failures drop out), and padding rows hold no
    screenshot; the distinct images are padded to a bucket, so every batch of one row bucket (and one length-group
    layout: one group here) reuses the same compiled log-prob and update programs instead of retracing for its
    image count. The advantage path runs on the whole padded batch (its padding rows marked), so it compiles once
    too (it retraced for every real-row count; that its padding rows change no advantage is
    tests/rl/test_advantages.py's test_padding_rows_marked_by_row_valid_change_no_advantage)."""
    config = get_config("toy")
    config.train.ppo_n_minibatches, config.train.ppo_n_epochs, config.train.length_groups = 1, 1, 1
    updater, tx = updater_for(policy, config)
    play_toy(toy_buffer, groups=4, group_size=4, epsilon=0.6, seed=5)
    episodes, _ = toy_buffer.read(None, group_size=4)
    params = jax.tree.map(lambda x: x.copy(), policy.params)
    opt_state = tx.init(params)
    counts = []
    for n in (13, 11):   # 39 and 33 real rows (3 turns each): one bucket of 40 rows
        batch = assemble(episodes[:n], screenshots=toy_buffer.screenshots,
                            image_processor=policy.processor.image_processor, n_minibatches=1, max_seq_len=512)
        assert batch.input_ids.shape[0] == 40 and batch.num_real_rows == 3 * n
        params, opt_state, stats = updater(params, opt_state, batch)
        assert np.isfinite(stats["actor_loss"])
        counts.append((updater._logprobs._cache_size(), updater._step._cache_size(),
                       adv_lib._token_advantages._cache_size()))
    assert counts[1] == counts[0], counts


def test_a_sharded_update_keeps_the_state_on_the_partition_rules(policy):
    """Text rows on a (data 2, fsdp 2, tensor 2) mesh of the 8 CPU devices, the mesh in context as the trainer runs
    it: the updated weights and AdamW moments keep their input's layout. XLA's propagation had split the norms'
    weights and moments over fsdp, so the second minibatch compiled the step again (and the next step the
    log-prob pass: `jax_log_compiles` showed both), and the state drifted off the rules the AOT report assumes."""
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    params = distributed.shard_from_host(policy.params, partition.param_shardings(policy.params, mesh))
    batch = assemble(synthetic_episodes(), screenshots=None, image_processor=None, n_minibatches=2, max_seq_len=64)
    updater = Updater(policy.module, UpdateSettings(n_minibatches=2, n_epochs=1),
                      OptimizerConfig(lr=1e-2, total_steps=2, updates_per_step=2))
    opt_state = partition.init_state(updater.optimizer.init, params)
    assert_on_partition_rules(params, opt_state, mesh)
    with jax.set_mesh(mesh):
        params, opt_state, _ = updater(params, opt_state, batch)
    assert_on_partition_rules(params, opt_state, mesh)


def _per_chip_flops(updater, params, split) -> float:
    """XLA's FLOPs for one chip's share of the log-prob pass over `split`'s minibatch (compiled for the mesh in
    context, or for one device without one)."""
    analysis = updater._logprobs.lower(params, split.minibatch, split.grid, split.groups).compile().cost_analysis()
    return float((analysis[0] if isinstance(analysis, (list, tuple)) else analysis)["flops"])


def test_on_a_mesh_each_length_group_is_whole_batch_shards_and_splits_over_the_chips(policy):
    """Text rows on a (data 2, fsdp 2, tensor 2) mesh, 4 length groups a minibatch. A group (or minibatch) whose row
    count the batch axes (4 chips) do not divide is not split over them (`constrain_batch` cannot), so its rows ran
    on several chips at once: groups of 2 and 6 rows cost a chip 1/3.6 of the whole pass's FLOPs. Now each group is
    whole batch shards (4 and 4 rows): 1/6.6 (1/8 is the ideal: 4 batch shards x 2 tensor shards)."""
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    divisor = mesh_lib.batch_divisor(mesh)
    batch = assemble(synthetic_episodes(seed=6, groups=5), screenshots=None, image_processor=None, n_minibatches=2,
                     max_seq_len=64, row_multiple=divisor)
    updater = Updater(policy.module, UpdateSettings(n_minibatches=2, n_epochs=1, length_groups=4),
                      OptimizerConfig(lr=1e-2, total_steps=2, updates_per_step=2))
    whole = _per_chip_flops(updater, policy.params, updater._split(batch)[0])   # one device: every row
    params = distributed.shard_from_host(policy.params, partition.param_shardings(policy.params, mesh))
    with jax.set_mesh(mesh):
        splits = updater._split(batch)
        assert len(splits[0].groups) > 1
        assert all(rows % divisor == 0 for split in splits for rows, _ in split.groups), [s.groups for s in splits]
        assert _per_chip_flops(updater, params, splits[0]) < whole / 5


def test_a_sampled_image_pad_token_is_replayed_as_the_text_token_the_sampler_decoded(policy):
    """A policy may sample `<|image_pad|>` (here a grammar puts it between the choices): the sampler decodes it as a
    text token (its embedding, the next text position). The trainer's replay shows images by `image_index`, and a
    run of image tokens that no image of the row fills is that same text: it neither takes an image's features
    nor an image's rope grid (which would shift every later row's image positions in the minibatch)."""
    sharp = _sharpened(policy)
    processor, tokenizer = sharp.processor, sharp.processor.tokenizer
    image = np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8)
    prompts = [processor.encode("<|vision_start|><|image_pad|><|vision_end|>click OK", [image]),
               processor.encode("<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n"),
               processor.encode("<|vision_start|><|image_pad|><|vision_end|>next", [image[:, ::-1]])]
    pad, end = processor.image_token_id, tokenizer.token_to_id("<|im_end|>")
    a, b = tokenizer.encode("a")[0], tokenizer.encode("b")[0]
    responses = [[x, pad, y, pad, pad, z] for x in (a, b) for y in (a, b) for z in (a, b)]
    grammar = TokenConstraint.from_token_sequences(responses, sharp.config.text.vocab_size, end)
    sampler = Sampler(sharp.module, sharp.config, pad_token_id=tokenizer.pad_token_id, decode_chunk=4,
                      prompt_multiple=32, constraint=grammar)
    results = sampler.generate((sharp.params, 0), prompts, SamplingParams(max_new_tokens=12, stop_token_ids=(end,)),
                               seed=5)
    assert all(r.tokens.tolist()[:-1] in responses for r in results)
    batch = _sampled_batch(prompts, results, n_minibatches=1, constraint=grammar)
    settings = UpdateSettings(n_minibatches=1, n_epochs=1)
    updater = Updater(sharp.module, settings, OptimizerConfig(lr=1e-3, total_steps=1), allowed_table=grammar.allowed)
    recomputed = updater.proximal_logprobs(sharp.params, batch)
    policy_tokens = batch.loss_mask.astype(bool)
    np.testing.assert_allclose(recomputed[policy_tokens], batch.behave_logprobs[policy_tokens], atol=1e-5, rtol=0)
