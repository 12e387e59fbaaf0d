"""Which task instances train and which evaluate: the seed split, in one place (imports nothing).

  [0, EVAL_SEED_START)                 supervised demonstrations (launch/sft.py's seeds must lie here)
  [EVAL_SEED_START, EVAL_SEED_END)     held-out evaluation instances (launch/eval.py's default --seed_start; the
                                       chain family draws its reserved goals only here)
  the rest of [0, 2**31 - 1)           RL workers draw instance seeds at random there (`training_seed`), so no
                                       RL episode plays an evaluation instance

EVAL_SEED_START is divisible by 4: its first four seeds play the toy's four instructions A, B, C, D.
"""

EVAL_SEED_START = 1_000_000
EVAL_SEED_END = 2_000_000
SEED_LIMIT = 2**31 - 1   # instance seeds are int32-sized


def training_seed(rng) -> int:
    """A uniform random instance seed in [0, SEED_LIMIT) outside the evaluation window (rng: numpy Generator)."""
    seed = int(rng.integers(SEED_LIMIT - (EVAL_SEED_END - EVAL_SEED_START)))
    return seed + (EVAL_SEED_END - EVAL_SEED_START) if seed >= EVAL_SEED_START else seed
