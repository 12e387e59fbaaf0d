"""The seed split (jaxwebrl/seeds.py): RL's random instance seeds never fall in the evaluation window."""

import numpy as np

from jaxwebrl.seeds import EVAL_SEED_END, EVAL_SEED_START, SEED_LIMIT, training_seed


class _Edges:
    """A generator stand-in that returns chosen draws, to check the window's edges exactly."""

    def __init__(self, draws):
        self.draws = list(draws)

    def integers(self, high):
        assert high == SEED_LIMIT - (EVAL_SEED_END - EVAL_SEED_START)
        return self.draws.pop(0)


def test_training_seeds_skip_the_evaluation_window_and_cover_the_rest():
    width = EVAL_SEED_END - EVAL_SEED_START
    edges = _Edges([0, EVAL_SEED_START - 1, EVAL_SEED_START, SEED_LIMIT - width - 1])
    assert [training_seed(edges) for _ in range(4)] == [0, EVAL_SEED_START - 1, EVAL_SEED_END, SEED_LIMIT - 1]
    rng = np.random.default_rng(0)
    seeds = np.array([training_seed(rng) for _ in range(20000)])
    assert ((seeds < EVAL_SEED_START) | (seeds >= EVAL_SEED_END)).all() and (seeds < SEED_LIMIT).all()
