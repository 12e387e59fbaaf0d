"""The agent of one step, apart from the loop: prompt from goal + history + memory, the policy's reply, memory and
action parsed from it, feedback from the environment into the history."""

import types

from jaxwebrl.env.agent.memory import MemoryTracker
from jaxwebrl.env.agent.prompt import PromptConfig
from jaxwebrl.rollout.agent import Agent, AgentTurn, step_texts


class EchoClient:
    """Answers every request with the next of `replies`; records what it was asked."""

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []

    def generate(self, messages, image_refs, **kwargs):
        self.requests.append((messages, list(image_refs), kwargs))
        return types.SimpleNamespace(text=self.replies.pop(0), timing=None)


def test_act_returns_a_typed_turn_and_observe_feeds_the_history():
    client = EchoClient(['Memory: {"target": "left"}\nclick(250, 500)', "I refuse"])
    agent = Agent(client, PromptConfig.from_dict({"window": 1}), max_new_tokens=16, temperature=0.5)
    history, tracker = [], MemoryTracker()
    turn = agent.act("press the left button", history, tracker, 7, max_steps=3, seed=11, group=(0, 5))
    assert isinstance(turn, AgentTurn) and turn.prompt.image_refs == [7]
    assert turn.action.is_valid and (turn.action.kind, turn.action.x, turn.action.y) == ("click", 250, 500)
    assert tracker.memory == {"target": "left"} and turn.memory.keys == 1 and turn.memory.chars > 0
    _, _, kwargs = client.requests[0]
    assert kwargs == {"max_new_tokens": 16, "temperature": 0.5, "top_p": 1.0, "seed": 11, "group": (0, 5)}
    feedback = agent.observe(turn, {"action_error": "the page did not react"}, history, 7)
    assert not feedback.invalid and feedback.text == "the page did not react" and len(history) == 1
    assert step_texts(turn, feedback, tracker, 1000)["action"] == "click(250, 500)"

    second = agent.act("press the left button", history, tracker, 8, max_steps=3, seed=None, group=(0, 5))
    assert second.prompt.image_refs == [7, 8]                       # the window shows the previous round
    assert "the page did not react" in str(client.requests[1][0])   # the feedback reached the next prompt
    feedback = agent.observe(second, {}, history, 8)
    assert feedback.invalid and feedback.text.startswith("invalid action:") and history[-1].feedback == feedback.text
    assert tracker.memory == {"target": "left"}                     # a reply without memory keeps the last one
