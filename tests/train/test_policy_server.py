"""The policy server on the tiny Qwen3-VL: batched generation for real workers, constrained actions, per-token
versions, hot-swapped weights, and behaviour log-probs equal to what the trainer recomputes."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxwebrl.models.config import tiny_config
from jaxwebrl.models.policy import Policy, init_params, tiny_policy
from jaxwebrl.models.serving_weights import serving_copy
from jaxwebrl.rollout.client import InProcessClient
from jaxwebrl.env.agent.action_space import MemoryGrammar
from jaxwebrl.env.registry import action_texts
from jaxwebrl.rollout.action_grammar import action_constraint
from jaxwebrl.rollout.continuous_server import ContinuousPolicyServer
from jaxwebrl.rollout.policy_server import PolicyServer
from jaxwebrl.rollout.serving import server_class
from jaxwebrl.rollout.vllm_server import VllmPolicyServer
from jaxwebrl.rollout.worker import STEP_TIMING_FIELDS, RolloutWorker, WorkerConfig
from jaxwebrl.train.assembly import assemble
from jaxwebrl.train.update import OptimizerConfig, Updater, UpdateSettings
from tests.train.conftest import SHORT_SYSTEM_PROMPT


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=1)


@pytest.mark.parametrize("memory", [None, MemoryGrammar(max_keys=2, value_chars=3)], ids=["empty", "free"])
def test_workers_get_valid_actions_and_behaviour_logprobs_match_recompute(policy, toy_buffer, memory):
    server = PolicyServer(policy, toy_buffer, max_batch=4, deadline_ms=50, decode_chunk=8,
                          action_texts=action_texts(["toy"]), memory=memory)
    try:
        config = WorkerConfig(tasks=("toy",), group_size=2, max_new_tokens=48 if memory is None else 80,
                              prompt={"window": 0, "system_prompt": SHORT_SYSTEM_PROMPT})
        workers = [RolloutWorker(config, InProcessClient(server.handle), toy_buffer, worker_id=i) for i in range(2)]
        threads = [threading.Thread(target=w.run, kwargs={"max_groups": 1}) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = server.stats()
    finally:
        server.close()
    assert stats["requests"] == sum(w.stats.steps for w in workers) and stats["generated_tokens"] > 0
    assert stats["batches"] < stats["requests"]  # requests of the two workers were decoded together
    assert sum(w.stats.invalid_actions for w in workers) == 0  # constrained decoding: well-formed actions only
    # every step's timings: the worker's clocks and the server's report of the same request (bench/rollout.py)
    steps = [dict(zip(STEP_TIMING_FIELDS, row)) for w in workers for row in w.stats.recent_steps]
    assert len(steps) == stats["requests"]
    for step in steps:
        assert all(step[k] is not None and step[k] >= 0 for k in STEP_TIMING_FIELDS)
        assert step["compute_s"] > 0 and 1 <= step["batch_size"] <= 4 and step["compiled"] in (0.0, 1.0)
        assert step["generate_s"] >= step["queue_s"] + step["encode_s"] + step["compute_s"]
    assert sum(step["compiled"] for step in steps) >= 1   # the first batch compiled its programs
    episodes, _ = toy_buffer.read(None, group_size=2)
    assert len(episodes) == 4
    for e in episodes:
        for versions, mask in ((s.versions, s.loss_mask) for s in e.steps):
            assert (versions[mask == 1] == 0).all() and (versions[mask == 0] == -1).all()

    # the trainer replays the grammar: the same restricted log-probs, forced tokens at exactly 0, and the one
    # choice of a toy response (button 0 or 1) the only token that carries loss; with a free memory, the
    # memory's characters are choices too, and the memory the policy wrote is what the steps record
    constraint = action_constraint(policy.processor, action_texts(["toy"]), policy.config.text.vocab_size,
                                   memory=memory)
    batch = assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                        n_minibatches=1, max_seq_len=512, constraint=constraint)
    updater = Updater(policy.module, UpdateSettings(n_minibatches=1, n_epochs=1), OptimizerConfig(lr=1e-3, total_steps=1),
                      allowed_table=constraint.allowed)
    recomputed = updater.proximal_logprobs(policy.params, batch)
    mask = batch.loss_mask.astype(bool)
    np.testing.assert_allclose(recomputed[mask], batch.behave_logprobs[mask], atol=1e-4)
    decisions = batch.decision_mask.astype(bool)
    decisions_per_row = batch.decision_mask.sum(axis=1)[:batch.num_real_rows]
    if memory is None:
        assert (decisions_per_row == 1).all()
    else:   # '}' or '"' after 'Memory: {', the button, and every character of a memory the policy wrote
        chars = [s.memory.chars for e in episodes for s in e.steps]
        assert (decisions_per_row >= 2).all() and max(chars) > 2   # ({} counts 0)
        assert sorted(decisions_per_row.tolist()) != [2] * batch.num_real_rows   # some rows wrote an entry
    assert (recomputed[mask & ~decisions] == 0).all()
    assert (recomputed[decisions] < 0).all() and (recomputed[decisions] > np.log(1e-3)).all()


def test_new_weights_take_effect_and_are_recorded(policy, toy_buffer):
    server = PolicyServer(policy, toy_buffer, max_batch=2, deadline_ms=1, decode_chunk=4)
    try:
        ref = toy_buffer.screenshots.put(np.zeros((64, 64, 3), np.uint8))
        request = {"op": "generate", "image_refs": np.array([ref]), "max_new_tokens": 8, "temperature": 1.0,
                   "top_p": 1.0, "seed": None,
                   "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "go"}]}]}
        first = server.handle(dict(request))
        assert set(first["versions"][first["loss_mask"] == 1].tolist()) == {0}
        server.set_weights(jax.tree.map(lambda x: x * 0.5, policy.params), 7)
        second = server.handle(dict(request))
        assert set(second["versions"][second["loss_mask"] == 1].tolist()) == {7}
        assert server.version == 7
    finally:
        server.close()


def test_weights_arrive_in_the_serving_dtype(toy_buffer):
    """fp32 master weights with bf16 compute: the server decodes from a bf16 copy, made once on receipt (leaves
    already bf16, as the trainer publishes them, are kept); serve_dtype='float32' keeps the master precision."""
    config = tiny_config(dtype="bfloat16").replace(param_dtype="float32")
    module, params = init_params(config, seed=0)
    master = Policy(config, module, params, tiny_policy().processor)
    server = PolicyServer(master, toy_buffer, max_batch=2)
    try:
        assert {leaf.dtype for leaf in jax.tree.leaves(server.weights()[0])} == {jnp.dtype(jnp.bfloat16)}
        published = serving_copy(params, jnp.bfloat16)
        server.set_weights(published, 3)
        assert all(a is b for a, b in zip(jax.tree.leaves(server.weights()[0]), jax.tree.leaves(published)))
        server.set_weights(params, 4)
        served = jax.tree.leaves(server.weights()[0])
        assert {leaf.dtype for leaf in served} == {jnp.dtype(jnp.bfloat16)}
        np.testing.assert_array_equal(np.asarray(served[0]), np.asarray(jax.tree.leaves(published)[0]))
    finally:
        server.close()
    fp32 = PolicyServer(master, toy_buffer, max_batch=2, serve_dtype="float32")
    try:
        assert all(a is b for a, b in zip(jax.tree.leaves(fp32.weights()[0]), jax.tree.leaves(params)))
    finally:
        fp32.close()


def test_continuous_batching_replies_as_static_batches(policy, toy_buffer):
    """Five seeded requests (two settings, the action grammar) reach a continuous server of two slots at once:
    rows join and leave at chunk boundaries and the slots switch setting, yet every reply equals, token for token,
    the static server's reply to the same request alone."""
    texts = action_texts(["toy"])
    images = np.random.default_rng(0).integers(0, 256, (5, 64, 64, 3), dtype=np.uint8)
    requests = [{"op": "generate", "image_refs": np.array([toy_buffer.screenshots.put(images[i])]),
                 "max_new_tokens": 40, "temperature": 0.0 if i == 3 else 1.0, "top_p": 1.0, "seed": 100 + i,
                 "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"go {i}"}]}]}
                for i in range(5)]
    static = PolicyServer(policy, toy_buffer, max_batch=4, decode_chunk=4, action_texts=texts)
    try:
        expected = [static.handle(dict(r)) for r in requests]
    finally:
        static.close()
    server = ContinuousPolicyServer(policy, toy_buffer, max_batch=2, decode_chunk=4, action_texts=texts)
    replies = [None] * len(requests)
    try:
        server.pause()   # every request queued before the first admission: the slots are contended

        def ask(i):
            replies[i] = server.handle(dict(requests[i]))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        time.sleep(0.5)
        server.resume()
        for t in threads:
            t.join()
        stats = server.stats()
    finally:
        server.close()
    for reply, reference in zip(replies, expected):
        for key in ("input_ids", "loss_mask", "versions"):
            np.testing.assert_array_equal(reply[key], reference[key])
        np.testing.assert_allclose(reply["behave_logprobs"], reference["behave_logprobs"], atol=1e-5, rtol=0)
        assert reply["text"] == reference["text"]
    assert stats["requests"] == 5 and stats["generated_tokens"] == sum(int(r["loss_mask"].sum()) for r in expected)
    assert max(reply["timing"]["batch_size"] for reply in replies) == 2   # rows decoded beside each other
    assert len({r["text"] for r in replies}) > 1


def test_the_run_config_picks_the_server():
    rollout = ConfigDict({"engine": "jax", "continuous_batching": False})
    assert server_class(rollout) is PolicyServer
    rollout.continuous_batching = True
    assert server_class(rollout) is ContinuousPolicyServer
    rollout.engine = "vllm"
    assert server_class(rollout) is VllmPolicyServer
