"""WebGym's task format, read as it is: one JSON object per line of a .jsonl file.

    {"task_id": "shop-0007", "task_name": "Find the cheapest red mug and answer with its price.",
     "website": "http://127.0.0.1:8000/shop/index.html", "domain": "shopping", "subdomain": "kitchen",
     "difficulty": "easy", "evaluator_reference": ["The answer names a red mug", {"description": "... its price"}],
     "reference_answer": "4.20"}

Required: `task_id`, `task_name` (the instruction), `website` (the start URL), `evaluator_reference` (the rubric: a
non-empty list of facts, each a string, {"description": "...", "difficulty": N} (the fact's own level, kept) or a
fact group {"id": ..., "description": "...", "facts": ["...", ...]}, whose facts the judge checks one by one, each
prefixed "[Group ID: DESCRIPTION] " as WebGym's evaluator reads them; any other key is refused: `rubric_facts`).
Optional: `domain`, `subdomain`, `difficulty`, `reference_answer` (a blank one is none), and `ground_truth`
({"answer": "...", "mode": "exact" | "contains" | "regex"}, no other key: the programmatic answer of a task whose site
is known, e.g. the bundled ones) and `solution` (the plan its oracle plays, `oracle.py`). Fields WebGym adds later, or
a user adds, are kept (`WebGymTask.extra`). A problem is one `TaskSpecError` line naming `FILE.jsonl:N`.

Difficulty (WebGym's rule, `difficulty_of`): a level of 1-3 is easy, 4-6 medium, 7+ hard. A line's integer
`difficulty` is WebGym's level (the number of facts its task was built with; WebGym's loader maps it by this rule to
its horizons) and is kept (`WebGymTask.difficulty_level`); one below 1 or not an integer is refused. A line's own
"easy" / "medium" / "hard" is taken as it is; without either, the rubric's number of facts is the level. Each
difficulty has its training horizon (HORIZONS: 10, 20, 30 steps).

Held-out split, stratified by difficulty (`held_out_ids`): within each difficulty the file's tasks are ordered by
(domain, subdomain, sha256(task_id)) and every 5th from the first is held out (`split=test`), so ceil(n/5) of a
difficulty's n tasks are, every difficulty the training split holds is in the test split too, and each difficulty's
held-out tasks spread over its domains in proportion; the others are `split=train`. No random generator: the split is
a function of the file's set of tasks (not their order), the same on every machine and Python version. Adding tasks
to a file may move others between the splits.

The reward is the verdict of the run's judge (`env.judge`, `judge.py`); the `ground_truth` judge (the default)
matches the agent's `answer(...)` against `ground_truth` (else `reference_answer`, exact after collapsing whitespace
and case). A task with neither (a rubric alone, as many of WebGym's own) plays with the evaluator
{"type": "judge"}: only a judge that reads the rubric can score it, and a run that names one under the ground-truth
judge is refused before anything starts (`train/config_validation.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import urllib.parse
from typing import Any

from jaxwebrl.env.tasks.webgym.oracle import check_solution
from jaxwebrl.env.tasks.webtask.task_spec import (EVALUATOR_MODES, TaskSpecError, WebTaskSpec, read_lines, short_repr,
                                                  spec_lines)

REQUIRED_FIELDS = ("task_id", "task_name", "website", "evaluator_reference")
KNOWN_FIELDS = REQUIRED_FIELDS + ("domain", "subdomain", "difficulty", "reference_answer", "ground_truth")
HORIZONS = {"easy": 10, "medium": 20, "hard": 30}
SPLITS = ("train", "test")
FACT_KEYS = ("description", "difficulty")   # a fact of WebGym's rubric as a dict; "difficulty" its level, default 1
GROUP_KEYS = ("id", "description", "facts")   # a fact group: its facts each checked with its id and description
FACT_FORMS = ('a non-empty string, {"description": "...", "difficulty": N} or a fact group {"id": ..., '
              '"description": "...", "facts": ["...", ...]}')
HELD_OUT_EVERY = 5   # one task in five of each difficulty is held out


@dataclasses.dataclass(frozen=True)
class WebGymTask:
    """One line of a WebGym task file. `facts` are the rubric's texts; `difficulty_level` the line's integer
    difficulty (WebGym's level; None when it gives a name or none); `rubric` its `evaluator_reference` as given
    (`facts` the texts the judge checks, `rubric_facts`); `extra` the line's other fields, as given."""

    task_id: str
    task_name: str
    website: str
    facts: tuple[str, ...]
    difficulty: str
    domain: str | None = None
    subdomain: str | None = None
    reference_answer: str | None = None
    ground_truth: dict | None = None
    difficulty_level: int | None = None
    rubric: tuple = dataclasses.field(default=(), compare=False)
    extra: dict = dataclasses.field(default_factory=dict, compare=False)
    source: str | None = dataclasses.field(default=None, compare=False)

    @property
    def horizon(self) -> int:
        return HORIZONS[self.difficulty]

    def web_spec(self) -> WebTaskSpec:
        """The JSON web-task spec this task plays as: start at `website`, confined to its origin, ended by an
        answer, matched against the ground truth (else the reference answer) or, with neither, left to a judge."""
        truth = self.ground_truth or ({"answer": self.reference_answer, "mode": "exact"} if self.reference_answer
                                      else None)
        evaluator = ({"type": "answer_match", "answer": truth["answer"], "mode": truth.get("mode", "exact")}
                     if truth else {"type": "judge"})     # a rubric alone: only a judge can score it
        parts = urllib.parse.urlsplit(self.website)
        allowlist = [f"{parts.scheme}://{parts.netloc}/*"] if parts.scheme in ("http", "https") else []   # file: its folder
        return WebTaskSpec.from_dict(
            {"task_id": self.task_id, "start_url": self.website, "goal": self.task_name, "max_steps": self.horizon,
             "difficulty": self.difficulty, "allowlist": allowlist,
             "evaluator": evaluator},
            base_dir=os.path.dirname(self.source.rpartition(":")[0]) if self.source else None, source=self.source)


def held_out_ids(tasks) -> set[str]:
    """The task_ids of the held-out (test) split of a file's `tasks` (WebGymTask each; see the module docstring)."""
    by_difficulty: dict[str, list] = {}
    for task in tasks:
        by_difficulty.setdefault(task.difficulty, []).append(task)
    held = set()
    for stratum in by_difficulty.values():
        ordered = sorted(stratum, key=lambda t: (t.domain or "", t.subdomain or "",
                                                 hashlib.sha256(t.task_id.encode()).hexdigest()))
        held.update(t.task_id for t in ordered[::HELD_OUT_EVERY])
    return held


def difficulty_of(level: int) -> str:
    """WebGym's difficulty of a level >= 1 (its integer `difficulty`, else the number of facts)."""
    return "easy" if level <= 3 else "medium" if level <= 6 else "hard"


def webgym_level(value: Any) -> int | None:
    """`value` when it is a WebGym difficulty level (an integer >= 1, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def rubric_facts(rubric: list) -> tuple[str, ...]:
    """The texts the judge checks, one a fact, of WebGym's `evaluator_reference` (module docstring); a fact group's
    each with its group's context "[Group ID: DESCRIPTION] FACT", as WebGym's evaluator is given it. ValueError
    naming the fact and the fix."""
    facts: list[str] = []
    for number, fact in enumerate(rubric, 1):
        if not isinstance(fact, dict):
            facts.append(_text(fact, number, "fact"))
            continue
        allowed = GROUP_KEYS if "facts" in fact else FACT_KEYS
        if set(fact) - set(allowed):
            raise ValueError(f"fact {number} has {sorted(set(fact) - set(allowed))}, which WebGym's facts do not "
                             f"carry: a fact is {FACT_FORMS}")
        if "facts" not in fact:
            level = fact.get("difficulty", 1)
            if webgym_level(level) is None:
                raise ValueError(f"fact {number}'s difficulty={short_repr(level)}: WebGym's level of a fact, an "
                                 f"integer >= 1 (or left out)")
            facts.append(_text(fact.get("description"), number, "description"))
            continue
        members = fact["facts"]
        if not isinstance(members, list) or not members or not all(isinstance(m, str) and m.strip() for m in members):
            raise ValueError(f"fact {number}'s facts={short_repr(members)}: a fact group's facts are a non-empty "
                             f"list of non-empty strings")
        context = f"[Group {fact.get('id', '')}: {fact.get('description', '')}] "
        facts.extend(context + member for member in members)
    return tuple(facts)


def _text(text: Any, number: int, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"fact {number}'s {what}={short_repr(text)}: a fact is {FACT_FORMS}")
    return text


def task_lines(path: str, split: str | None = None) -> list[int]:
    """The numbers of the task lines of a WebGym file (non-blank), only those of `split` when given.

    Every line is validated, and a `task_id` used twice is refused: the report's rows and the held-out split key on it.
    """
    if split is not None and split not in SPLITS:
        raise TaskSpecError(f"webgym task file {path}: split={split!r}: use one of {list(SPLITS)}")
    tasks = {n: load_task_line(path, n) for n in spec_lines(path)}
    first_line: dict[str, int] = {}
    for number, task in tasks.items():
        if first_line.setdefault(task.task_id, number) != number:
            raise TaskSpecError(f"webgym task {path}:{number}: task_id {task.task_id!r} is line "
                                f"{first_line[task.task_id]}'s too: give each task its own id")
    held = held_out_ids(tasks.values())
    return [n for n, task in tasks.items() if split is None or (task.task_id in held) == (split == "test")]


def load_task_line(path: str, number: int) -> WebGymTask:
    """Read and validate line `number` (1-based) of a WebGym task file; TaskSpecError names `path:number`."""
    where = f"{path}:{number}"
    lines = read_lines(path)
    if not 1 <= number <= len(lines) or not lines[number - 1].strip():
        raise TaskSpecError(f"webgym task {where}: no task on that line ({path} has {len(lines)} lines)")
    try:
        record = json.loads(lines[number - 1])
    except (ValueError, RecursionError) as err:
        raise TaskSpecError(f"webgym task {where}: not valid JSON ({short_repr(err, 120)}): one JSON object per line, "
                            "fix that line") from None
    return parse_task(record, os.path.abspath(path) + f":{number}", where)


def parse_task(record: Any, source: str | None, where: str) -> WebGymTask:
    """A WebGym record as a `WebGymTask`; TaskSpecError (one line naming `where`, the field and the fix)."""
    def fail(field: str, fix: str) -> None:
        raise TaskSpecError(f"webgym task {where}: {field!r}={short_repr(record.get(field))}: {fix}")

    if not isinstance(record, dict):
        raise TaskSpecError(f"webgym task {where} must be a JSON object, got {type(record).__name__}")
    missing = [f for f in REQUIRED_FIELDS if f not in record]
    if missing:
        raise TaskSpecError(f"webgym task {where} is missing {missing}; WebGym's required fields: "
                            f"{list(REQUIRED_FIELDS)}")
    for field in ("task_id", "task_name", "website"):
        if not isinstance(record[field], str) or not record[field].strip():
            fail(field, "must be a non-empty string")
    for field in ("domain", "subdomain", "reference_answer"):
        if record.get(field) is not None and not isinstance(record[field], str):
            fail(field, "must be a string (or left out)")
    rubric = record["evaluator_reference"]
    if not isinstance(rubric, list) or not rubric:
        fail("evaluator_reference", f"must be a non-empty list of facts ({FACT_FORMS})")
    try:
        facts = rubric_facts(rubric)
    except ValueError as err:
        fail("evaluator_reference", str(err))
    difficulty = record.get("difficulty")
    level = webgym_level(difficulty)
    if difficulty is None or level is not None:
        difficulty = difficulty_of(len(facts) if level is None else level)
    elif difficulty not in HORIZONS:
        fail("difficulty", f"must be one of {list(HORIZONS)}, an integer level >= 1 (1-3 easy, 4-6 medium, 7+ hard: "
                           f"WebGym's), or left out (the number of facts decides)")
    truth = record.get("ground_truth")
    if truth is not None:
        if (not isinstance(truth, dict) or set(truth) - {"answer", "mode"} or not isinstance(truth.get("answer"), str)
                or not truth["answer"].strip() or truth.get("mode", "exact") not in EVALUATOR_MODES["answer_match"]):
            fail("ground_truth", f"must be {{\"answer\": \"...\", \"mode\": "
                                 f"{' | '.join(EVALUATOR_MODES['answer_match'])}}}")
    reference = record.get("reference_answer")
    reference = reference if reference and reference.strip() else None   # a blank one is none
    if "solution" in record:
        try:
            check_solution(record["solution"])
        except ValueError as err:
            fail("solution", str(err))
    task = WebGymTask(task_id=record["task_id"], task_name=record["task_name"], website=record["website"],
                      facts=facts, difficulty=difficulty, domain=record.get("domain"),
                      subdomain=record.get("subdomain"), reference_answer=reference,
                      ground_truth=truth, difficulty_level=level, rubric=tuple(rubric),
                      extra={k: v for k, v in record.items() if k not in KNOWN_FIELDS},
                      source=source)
    try:
        task.web_spec()
    except TaskSpecError as err:
        raise TaskSpecError(f"webgym task {where}: {str(err).partition(': ')[2]}") from None
    return task
