"""Policy client (remote and in-process) with the scripted test backend: token fields are consistent."""

import math

import numpy as np
import pytest

from jaxwebrl.env.tasks.toy import toy
from jaxwebrl.env.agent.actions import parse_action
from jaxwebrl.env.agent.memory import split_memory
from jaxwebrl.env.agent.prompt import PromptConfig, build_prompt
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.client import Generation, InProcessClient, PolicyClient, generate_request
from jaxwebrl.rollout.scripted import ScriptedBackend, random_choice_responder, toy_oracle_responder
from jaxwebrl.rollout.transport import TransportServer, new_token

SHOTS = {5: np.zeros((64, 64, 3), np.uint8), 6: np.full((64, 64, 3), 200, np.uint8)}


def toy_prompt(seed=2, window=1):
    obs = toy.ToyEnv().reset(seed)
    return obs.goal, build_prompt(obs.goal, [], 5, {}, PromptConfig(window=window), max_steps=3)


def test_scripted_generation_over_the_wire_is_token_consistent():
    processor = tiny_processor()
    backend = ScriptedBackend(toy_oracle_responder(), processor=processor, fetch_image=SHOTS.__getitem__, version=7)
    token = new_token()
    goal, prompt = toy_prompt()
    with TransportServer(backend, token=token) as server:
        client = PolicyClient(server.address, token=token)
        gen = client.generate(prompt.messages, prompt.image_refs, max_new_tokens=128)
        client.close()
    _, action_text = split_memory(gen.text)
    assert action_text == "Action: " + toy.oracle_action_text(goal, 0)
    assert parse_action(action_text).x == 750  # pattern C starts with button 1
    policy = gen.loss_mask == 1
    # prompt tokens are exactly what the processor makes (image pads expanded), response = text + EOS
    expected_prompt = processor(prompt.messages, [SHOTS[5]])["input_ids"]
    np.testing.assert_array_equal(gen.input_ids[~policy], expected_prompt)
    assert int((expected_prompt == processor.image_token_id).sum()) > 1
    assert processor.decode(gen.input_ids[policy]) == gen.text + "<|im_end|>"
    assert np.all(policy[len(expected_prompt):]) and not policy[: len(expected_prompt)].any()
    assert np.all(gen.versions[policy] == 7) and np.all(gen.versions[~policy] == -1)
    assert gen.behave_logprobs[policy].sum() == pytest.approx(0.0)  # the oracle is deterministic
    assert np.all(gen.behave_logprobs[~policy] == 0)


def test_random_responder_logprobs_sum_to_the_choice_probability_and_versions_follow_publishes():
    texts = ["click(250, 500)", "click(750, 500)", "gibberish"]
    backend = ScriptedBackend(random_choice_responder(texts), seed=3)
    client = InProcessClient(backend)
    _, prompt = toy_prompt()
    seen = set()
    for version in range(6):
        backend.set_version(version)
        gen = client.generate(prompt.messages, prompt.image_refs, max_new_tokens=64)
        seen.add(split_memory(gen.text)[1])
        assert gen.behave_logprobs[gen.loss_mask == 1].sum() == pytest.approx(-math.log(3), rel=1e-5)
        assert set(gen.versions[gen.loss_mask == 1]) == {version}
    assert seen <= {"Action: " + t for t in texts} and len(seen) > 1


def test_in_process_and_wire_clients_agree_for_a_fixed_seed():
    backend = ScriptedBackend(toy_oracle_responder(epsilon=1.0))
    _, prompt = toy_prompt(seed=1)
    token = new_token()
    local = InProcessClient(backend).generate(prompt.messages, prompt.image_refs, max_new_tokens=64, seed=11)
    with TransportServer(backend, token=token) as server:
        remote = PolicyClient(server.address, token=token).generate(prompt.messages, prompt.image_refs,
                                                                    max_new_tokens=64, seed=11)
    assert local.text == remote.text
    for name in ("input_ids", "loss_mask", "behave_logprobs", "versions"):
        np.testing.assert_array_equal(getattr(local, name), getattr(remote, name))


def test_max_new_tokens_cuts_the_response():
    gen = InProcessClient(ScriptedBackend(toy_oracle_responder())).generate(*toy_prompt()[1], max_new_tokens=5)
    assert gen.num_policy_tokens == 5 and len(gen.text) == 5


def test_bad_requests_and_replies_are_refused_with_clear_errors():
    _, prompt = toy_prompt()
    with pytest.raises(ValueError, match="2 image_refs"):
        generate_request(prompt.messages, [1, 2], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_request(prompt.messages, [1], max_new_tokens=0)
    with pytest.raises(ValueError, match="lacks \\['versions'\\]"):
        Generation.from_reply({"text": "", "input_ids": [1], "loss_mask": [1], "behave_logprobs": [0.0]})
    with pytest.raises(ValueError, match="length 2"):
        Generation("x", np.arange(3), np.ones(2), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="-1 exactly on prompt tokens"):
        Generation("x", np.arange(2), np.array([0, 1]), np.zeros(2), np.array([0, 0]))
    with pytest.raises(ValueError, match="responder must be one of"):
        ScriptedBackend.from_config({"responder": "gpt"})
    with pytest.raises(ValueError, match="bad options"):
        ScriptedBackend.from_config({"responder": "toy_oracle", "texts": ["a"]})
