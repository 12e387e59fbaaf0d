"""Which task instances train and which evaluate: the seed split, in one place (imports nothing).

  [0, EVAL_SEED_START)        supervised demonstrations (launch/sft.py's seeds must lie here)
  [EVAL_SEED_START, ...)      held-out evaluation instances (launch/eval.py's default --seed_start)
  [0, 2**31)                  RL workers draw instance seeds at random, so a fixed eval range is held out in practice

EVAL_SEED_START is divisible by 4: its first four seeds play the toy's four instructions A, B, C, D.
"""

EVAL_SEED_START = 1_000_000
