"""What a regex grammar costs to build over the real Qwen vocabulary (151,936 ids), for two or more trees side by
side: the engine judge's verdict grammars (one per fact count a run's rubrics have, built on the policy server while
it serves) and the long recipe's free-memory action grammar (built by the server, the trainer and the warm start).

    python3 bench/grammar_cost.py --arm=before:/tmp/wt-before --arm=after:$PWD --runs=2

An arm is NAME:PYTHONPATH (its tree first); a grammar is `verdict:<facts>` or `long_actions` (default: verdicts of
1, 3 and 7 facts, and the action grammar). Each round builds every grammar once in each arm, arms alternating,
each in a fresh process (the tokenizer's token strings are made before the clock starts): its CPU seconds (the
process's own, `time.process_time`) and wall seconds around `TokenConstraint.from_regex`, the automaton's states,
a SHA-256 of its tables, so the arms are seen to build the same automaton, the tokens some state allows, and the
bytes of the tables a sampler puts on the device: dense [S, V] bool + int32, or, in a tree that has it, the compact
form (`TokenConstraint.compact`, with the CPU seconds it takes). Needs the `qwen` extra (dashscope's
rank file). Prints JSON: every run, and each grammar's median CPU seconds per arm.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys

from absl import app, flags

_ARMS = flags.DEFINE_multi_string("arm", None, "NAME:PYTHONPATH, one or more", required=True)
_GRAMMARS = flags.DEFINE_list("grammars", ["verdict:1", "verdict:3", "verdict:7", "long_actions"],
                              "what to build: verdict:<facts> (the engine judge's) or long_actions")
_RUNS = flags.DEFINE_integer("runs", 2, "builds of every grammar in every arm")

# Run in the arm's tree: GRAMMAR is "verdict:<facts>" or "long_actions".
BUILD = """
import hashlib, json, sys, time
from jaxwebrl.models.constraints import TokenConstraint
try:
    from jaxwebrl.models.sampler import MIN_TABLE_COLUMNS
except ImportError:   # a tree from before the compact tables
    MIN_TABLE_COLUMNS = None
from jaxwebrl.models.qwen_vocab import QWEN_EMBEDDING_ROWS, qwen_tokenizer
tokenizer = qwen_tokenizer()
strings = tokenizer.token_strings(QWEN_EMBEDDING_ROWS)
grammar = sys.argv[1]
if grammar.startswith("verdict:"):
    from jaxwebrl.env.tasks.webgym.judge import verdict_regex
    pattern = verdict_regex(int(grammar.split(":")[1]), True, True)
else:
    from configs.constT10 import get_config
    from jaxwebrl.env.agent.action_space import config_memory_grammar, response_regex
    from jaxwebrl.env.registry import config_action_texts
    config = get_config("long")
    pattern = response_regex(config_action_texts(config), config_memory_grammar(config))
cpu, wall = time.process_time(), time.perf_counter()
constraint = TokenConstraint.from_regex(pattern, strings, tokenizer.eos_token_id)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
digest = hashlib.sha256(constraint.allowed.tobytes() + constraint.next_state.tobytes()).hexdigest()[:16]
record = {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "states": len(constraint.allowed),
          "vocab": constraint.allowed.shape[1], "tables_sha256": digest,
          "active_tokens": int(constraint.allowed.any(axis=0).sum()),
          "dense_table_bytes": constraint.allowed.nbytes + constraint.next_state.nbytes}
if hasattr(constraint, "compact"):   # a tree whose sampler puts the compact form on the device
    cpu = time.process_time()
    compact = constraint.compact(min_columns=MIN_TABLE_COLUMNS)
    record.update(compact_cpu_s=round(time.process_time() - cpu, 3), compact_columns=compact[0].shape[1],
                  compact_table_bytes=sum(table.nbytes for table in compact))
print(json.dumps(record))
"""


def build_in(pythonpath: str, grammar: str) -> dict:
    """One fresh process of the arm builds `grammar`; its JSON line."""
    done = subprocess.run([sys.executable, "-c", BUILD, grammar], cwd=pythonpath.split(":")[0], check=True,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": pythonpath})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv) -> None:
    del argv
    arms = dict(arm.split(":", 1) for arm in _ARMS.value)
    grammars = _GRAMMARS.value
    unknown = [g for g in grammars if not re.fullmatch(r"verdict:\d+|long_actions", g)]
    if unknown:
        sys.exit(f"usage error: unknown grammars {unknown}: use verdict:<facts> or long_actions")
    runs = {grammar: {name: [] for name in arms} for grammar in grammars}
    for _ in range(_RUNS.value):
        for grammar in grammars:
            for name, pythonpath in arms.items():
                runs[grammar][name].append(build_in(pythonpath, grammar))
    median = {grammar: {name: statistics.median(r["cpu_s"] for r in by_arm[name]) for name in arms}
              for grammar, by_arm in runs.items()}
    same = {grammar: len({r["tables_sha256"] for rs in by_arm.values() for r in rs}) == 1
            for grammar, by_arm in runs.items()}
    print(json.dumps({"what": "TokenConstraint.from_regex over the Qwen vocabulary, CPU seconds of the build",
                      "arms": arms, "cpus": os.cpu_count(), "load_average_end": os.getloadavg(),
                      "median_cpu_s": median, "same_tables_in_every_arm": same, "runs": runs}, indent=1))


if __name__ == "__main__":
    app.run(main)
