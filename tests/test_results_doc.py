"""docs/results.md against its evidence: every figure row names a JSON under docs/results/, a key path into it and the
doc line that quotes it; the number must match the JSON within the rounding shown, and that line must still say it
(so README and docs cannot drift from the JSON). No JSON under docs/results/ may be empty.

A quote binds its figure to what it is: it holds the value as a whole number and names it (a word besides units
and joiners, or it starts at its table row's first cell), so two figures swapped in a doc break both quotes. A
quote may run across a paragraph's line breaks; code blocks are not claims. In each of `BOUND_DOCS` (and of
`BOUND_SECTIONS`) every number outside code must stand inside a figure row's quote or a `## Not measurements` text
(doc | text | why: settings, versions, notation, targets), so a count changed in prose fails too.

The format (docs/results.md says the same for a reader): two markdown tables, `## Sources` (json | command | commit |
machine | alone) and `## Figures` (figure | kind | value | scale | json | key | doc | quote). `json` is relative to
docs/results/. A key is `path`, `fn(path)` (fn: mean, min, max, sum, len, abs, sqrt), a number, or arithmetic on
keys: `+ - * /`, each between spaces, with the usual precedence, left to right, and `( )` to group. A path is dot-separated names (`"a - b"` quoted when a name holds spaces or dots), each followed by
any of `[i]` (a list index), `[*]` (every element) or `[k=v,...]` (the one element of a list whose fields equal
those values; a JSONL file is the list of its lines). `scale` maps the JSON number to the shown one (`×100`,
`÷1e9`, `÷2^30`, `×1`); the tolerance is half the last digit shown (an integer of 4+ digits ending in zeros:
half of that power of ten).
"""

import functools
import glob
import json
import math
import os
import re
import statistics

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_MD = os.path.join(REPO, "docs", "results.md")
RESULTS_DIR = os.path.join(REPO, "docs", "results")
FIGURE_COLUMNS = ["figure", "kind", "value", "scale", "json", "key", "doc", "quote"]
SOURCE_COLUMNS = ["json", "command", "commit", "machine", "alone"]
EXEMPT_COLUMNS = ["doc", "text", "why"]
# Docs whose every number is a figure row's or a listed non-measurement.
BOUND_DOCS = ("README.md", "docs/fleet_model.md", "docs/learning.md", "docs/live_loop.md", "docs/env.md",
              "docs/architecture.md", "docs/usage.md", "docs/interfaces.md", "docs/scaling.md")
# Sections (doc, `#`/`## ` heading) bound the same way, in docs not yet bound whole.
BOUND_SECTIONS = (
    ("docs/results.md", "Results: every figure and the JSON behind it"), ("docs/results.md", "What is measured"),
    ("docs/results.md", "Wording fixed against the JSON (issue 29)"),
)
KINDS = {"measured", "roofline", "model", "paper"}  # roofline: an AOT bound from XLA's analysis; model: jaxwebrl/plan;
# paper: the paper's own figure, as the JSON that compares against it holds it
FUNCTIONS = {"mean": statistics.mean, "min": min, "max": max, "sum": sum, "len": len, "abs": abs, "sqrt": math.sqrt}


def cells(line: str) -> list:
    """A markdown table row's cells, `\\|` kept as a literal bar, surrounding backticks dropped."""
    parts = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    out = []
    for p in parts:
        p = p.strip().replace("\\|", "|")
        out.append(p[1:-1] if len(p) > 1 and p[0] == p[-1] == "`" else p)
    return out


def table(text: str, heading: str, columns: list) -> list:
    """The rows (dicts) of the first table under `## heading`, its header checked against `columns`."""
    section = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, f"docs/results.md has no '## {heading}' section: add it (format in tests/test_results_doc.py)"
    lines = [ln for ln in section.group(1).splitlines() if ln.startswith("|")]
    assert lines and cells(lines[0]) == columns, (
        f"docs/results.md '## {heading}' table header is {cells(lines[0]) if lines else None}, expected {columns}")
    rows = []
    for ln in lines[2:]:
        row = cells(ln)
        assert len(row) == len(columns), f"docs/results.md '## {heading}': row has {len(row)} cells, not " \
                                         f"{len(columns)}: {ln[:120]}"
        rows.append(dict(zip(columns, row)))
    return rows


@functools.lru_cache(maxsize=None)
def load(rel: str):
    """A JSON file, or a JSONL file as the list of its lines' objects (parsed once: read-only)."""
    path = os.path.join(RESULTS_DIR, rel)
    with open(path) as f:
        text = f.read()
    if rel.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def _matches(item, conditions: dict) -> bool:
    if not isinstance(item, dict):
        return False
    for k, v in conditions.items():
        if k not in item:
            return False
        got = item[k]
        if isinstance(got, (int, float)) and not isinstance(got, bool):
            try:
                if float(v) != got:
                    return False
            except ValueError:
                return False
        elif str(got) != v:
            return False
    return True


def resolve(data, path: str):
    """The value (or, after a `[*]`, the list of values) at `path` in `data`; KeyError naming the failing step."""
    values, many = [data], False
    for token in re.findall(r'"[^"]*"|\[[^\]]*\]|[^.\[\]"]+', path):
        token = token.strip('"') if token.startswith('"') else token
        nxt = []
        for v in values:
            if not token.startswith("["):
                if not isinstance(v, dict) or token not in v:
                    raise KeyError(f"no field '{token}' (have {sorted(v)[:12] if isinstance(v, dict) else type(v)})")
                nxt.append(v[token])
            elif token == "[*]":
                nxt.extend(v)
                many = True
            elif "=" in token:
                conditions = dict(c.split("=", 1) for c in token[1:-1].split(","))
                hits = [x for x in v if _matches(x, conditions)]
                if len(hits) != 1:
                    raise KeyError(f"{token} selects {len(hits)} elements, not one")
                nxt.append(hits[0])
            else:
                i = int(token[1:-1])
                if not isinstance(v, list) or not -len(v) <= i < len(v):
                    raise KeyError(f"{token} is out of range")
                nxt.append(v[i])
        values = nxt
    return values if many else values[0]


ARITHMETIC = {" + ": lambda x, y: x + y, " - ": lambda x, y: x - y, " * ": lambda x, y: x * y,
              " / ": lambda x, y: x / y}


def _last_outside(key: str, ops: tuple[str, ...]) -> tuple[int, str] | None:
    """(index, op) of the last of `ops` in `key` outside double quotes, brackets and parentheses, else None."""
    depth, quoted, last = 0, False, None
    for i, ch in enumerate(key):
        quoted ^= ch == '"'
        depth += (ch in "[(") - (ch in "])")
        for op in ops:
            if not quoted and depth == 0 and key.startswith(op, i):
                last = (i, op)
    return last


def _grouped(key: str) -> bool:
    """Whether `key` is one parenthesised group, `( ... )`."""
    if not key.startswith("("):
        return False
    depth, quoted = 0, False
    for i, ch in enumerate(key):
        quoted ^= ch == '"'
        depth += (not quoted) * ((ch == "(") - (ch == ")"))
        if depth == 0:
            return i == len(key) - 1
    return False


def evaluate(data, key: str) -> float:
    """The number a key expression names (see the module docstring): `+ -` bind looser than `* /`, and an operator
    splits at its last occurrence, so `a - b - c` is `(a - b) - c`."""
    key = key.strip()
    for ops in ((" + ", " - "), (" * ", " / ")):
        found = _last_outside(key, ops)
        if found:
            at, op = found
            return ARITHMETIC[op](evaluate(data, key[:at]), evaluate(data, key[at + len(op):]))
    if _grouped(key):
        return evaluate(data, key[1:-1])
    if re.fullmatch(r"-?\d+(\.\d+)?", key):
        return float(key)  # a constant, as in `60 / s_per_update`
    call = re.fullmatch(r"(\w+)\((.*)\)", key)
    if call and call.group(1) in FUNCTIONS:
        return float(FUNCTIONS[call.group(1)](resolve(data, call.group(2))))
    value = resolve(data, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KeyError(f"resolves to {value!r:.60}, not a number")
    return float(value)


def shown(value: str):
    """('60.1' -> (60.1, 0.05)); commas and a Unicode minus allowed."""
    text = value.replace(",", "").replace("\u2212", "-")
    number = float(text)
    if "." in text:
        tolerance = 0.5 * 10 ** -len(text.split(".")[1])
    else:  # "9,800" is rounded to hundreds, "70" is not rounded to tens
        digits = text.lstrip("-+")
        zeros = len(digits) - len(digits.rstrip("0")) if len(digits) >= 4 else 0
        tolerance = 0.5 * 10 ** zeros
    return number, tolerance


def scale_of(scale: str) -> float:
    op, amount = scale[0], scale[1:].strip()
    assert op in "×÷", f"scale '{scale}' must start with × or ÷ (e.g. ×100, ÷1e9, ÷2^30)"
    base, _, power = amount.partition("^")
    factor = float(base) ** float(power) if power else float(base)
    return factor if op == "×" else 1 / factor


def normalise(text: str) -> str:
    return " ".join(text.replace("*", "").replace("\\|", "|").split())


def _doc(rel: str, text: str | None = None) -> list:
    """The doc's blocks, normalised: a paragraph's lines joined into one (so a quote may run across a line
    break), each table row or heading its own, code blocks left out. For docs/results.md without its `## Figures`
    and `## Not measurements` tables, whose rows hold every quote and listed text and so would match themselves
    (its bench table and prose quote figures like any other doc). `text` stands in for the file's (a mutated copy)."""
    if text is None:
        with open(os.path.join(REPO, rel)) as f:
            text = f.read()
    if os.path.abspath(os.path.join(REPO, rel)) == RESULTS_MD:
        text = re.sub(r"^## (Figures|Not measurements)\s*$.*?(?=^## |\Z)", "", text, flags=re.M | re.S)
    blocks, paragraph, fenced = [], [], False
    for line in text.splitlines() + [""]:
        fence = line.startswith("```")
        if line.strip() and not line.startswith(("|", "#")) and not (fence or fenced):
            paragraph.append(line)
            continue
        if paragraph:
            blocks.append(normalise(" ".join(paragraph)))
            paragraph = []
        if not (fence or fenced):   # a code block holds commands and their output, not claims
            blocks.append(normalise(line))
        fenced ^= fence
    return blocks


def _parse():
    with open(RESULTS_MD) as f:
        text = f.read()
    return (table(text, "Sources", SOURCE_COLUMNS), table(text, "Figures", FIGURE_COLUMNS),
            table(text, "Not measurements", EXEMPT_COLUMNS))


SOURCES, FIGURES, NOT_MEASUREMENTS = _parse()


def unbound_numbers(rel: str, blocks: list, rows: list, exempt: list) -> list:
    """One line for each number in `blocks` (doc `rel`'s, outside code and link targets) that no figure row's quote
    and no `## Not measurements` text of that doc covers: a number nothing checks."""
    covering = {normalise(r["quote"]) for r in rows if r["doc"] == rel}
    covering |= {normalise(e["text"]) for e in exempt if e["doc"] == rel}
    problems = []
    for block in blocks:
        masked = re.sub(r"`[^`]*`|\]\([^)]*\)", lambda m: " " * len(m.group()), block)
        spans = [(m.start(), m.end()) for q in covering for m in re.finditer(re.escape(q), block)]
        for number in NUMBER.finditer(masked):
            if not any(a <= number.start() and number.end() <= b for a, b in spans):
                context = block[max(0, number.start() - 50):number.end() + 30]
                problems.append(f"{rel}: {number.group()} in '{context}' has no figure row whose quote holds it "
                                f"(docs/results.md `## Figures`) and is not in `## Not measurements`: add the row "
                                f"with its JSON, or the text with why it is no result")
    return problems


def doc_problems(rel: str, text: str | None = None) -> list:
    """Every problem of doc `rel` (or of `text` standing in for it): its figure rows and its unbound numbers."""
    docs = {rel: _doc(rel, text)}
    sources = {s["json"] for s in SOURCES}
    problems = [f"row '{r['figure']}': {p}" for r in FIGURES if r["doc"] == rel
                for p in [check_figure(r, docs, sources)] if p]
    return problems + unbound_numbers(rel, docs[rel], FIGURES, NOT_MEASUREMENTS)


# Words that cannot tell two figures apart (units, joiners): a quote needs a word besides these.
NOT_LABELS = {"a", "an", "and", "at", "by", "in", "is", "of", "on", "or", "per", "the", "to", "vs", "x", "s", "ms",
              "us", "kb", "mb", "gb", "tb", "mib", "gib", "tok", "tokens", "traj", "flop", "flops", "gflop", "tflop"}
NUMBER = re.compile(r"(?<![\w.\-])[+\-\u2212]?\d+(?:,\d{3})*(?:\.\d+)?(?![\w]|[.,]\d)")


def label_words(quote: str) -> list:
    """The words of a quote that can say what its figure is (2+ characters from a letter, not NOT_LABELS)."""
    return [w for w in re.findall(r"[^\W\d_]\w+", quote) if w.lower() not in NOT_LABELS]


def value_at(value: str, quote: str) -> bool:
    """Whether `value` stands in `quote` as a whole number ('4.61' in '14.61' or '4.615' does not)."""
    return re.search(rf"(?<![\d.,]){re.escape(value)}(?!\d|[.,]\d)", quote) is not None


def check_figure(row: dict, docs: dict, sources: set) -> str:
    """'' when the row holds, else one line naming the mismatch."""
    if row["kind"] not in KINDS:
        return f"kind '{row['kind']}' is not one of {sorted(KINDS)}"
    if row["json"] not in sources:
        return f"json {row['json']} is not in the Sources table: add its command, commit, machine"
    path = os.path.join(RESULTS_DIR, row["json"])
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return f"docs/results/{row['json']} is missing or empty"
    try:
        got = evaluate(load(row["json"]), row["key"]) * scale_of(row["scale"])
    except (KeyError, ValueError, TypeError, ZeroDivisionError, statistics.StatisticsError) as e:
        return f"key '{row['key']}' in docs/results/{row['json']}: {e}"
    want, tolerance = shown(row["value"])
    if not math.isclose(got, want, abs_tol=tolerance * (1 + 1e-9)):
        return f"docs/results/{row['json']} '{row['key']}' {row['scale']} is {got:.6g}, the row says {row['value']}"
    if not value_at(row["value"], row["quote"]):
        return f"the quote does not contain the value {row['value']} as a number: '{row['quote'][:80]}'"
    if row["doc"] not in docs:
        docs[row["doc"]] = _doc(row["doc"]) if os.path.isfile(os.path.join(REPO, row["doc"])) else None
    if docs[row["doc"]] is None:
        return f"doc {row['doc']} does not exist"
    quote = normalise(row["quote"])
    if not any(quote in line for line in docs[row["doc"]]):
        return f"{row['doc']} has no line saying '{row['quote'][:100]}' any more: update the doc or this row"
    if not label_words(quote) and not any(line.startswith(f"| {quote}") for line in docs[row["doc"]]):
        return (f"the quote '{row['quote'][:80]}' names nothing: quote the words that say what {row['value']} "
                f"is (or start it at its table row's first cell), so a swapped figure fails")
    return ""


_DOCS = {}


@pytest.mark.parametrize("row", FIGURES, ids=[r["figure"] for r in FIGURES])
def test_figure_matches_its_json_and_its_doc_line(row):
    problem = check_figure(row, _DOCS, {s["json"] for s in SOURCES})
    assert not problem, f"docs/results.md row '{row['figure']}': {problem}"


def test_tables_are_well_formed():
    names = [r["figure"] for r in FIGURES]
    assert len(names) == len(set(names)), f"figure names repeat: {sorted({n for n in names if names.count(n) > 1})}"
    for s in SOURCES:
        assert re.fullmatch(r"[0-9a-f]{7,40}|unknown", s["commit"]), f"Sources {s['json']}: commit '{s['commit']}'"
        assert s["alone"] in {"alone", "under load", "unknown", "n/a"}, f"Sources {s['json']}: alone '{s['alone']}'"
        assert os.path.isfile(os.path.join(RESULTS_DIR, s["json"])), f"Sources: docs/results/{s['json']} is missing"


def test_the_checker_catches_a_drifted_value_a_bad_key_and_a_stale_quote():
    row = dict(FIGURES[0])
    sources = {s["json"] for s in SOURCES}
    assert check_figure(row, {}, sources) == ""
    want, tolerance = shown(row["value"])
    drifted = dict(row, value=f"{want + 3 * tolerance + 1:.6g}")
    assert "the row says" in check_figure(drifted, {}, sources)
    assert "key" in check_figure(dict(row, key=row["key"] + ".no_such_field"), {}, sources)
    assert "no line saying" in check_figure(dict(row, quote=row["quote"] + " and more"), {}, sources)
    assert not any(f"| {row['figure']} |" in line for line in _doc("docs/results.md")), \
        "docs/results.md's own figure rows must not count as lines quoting a figure"


def test_key_paths_rounding_and_scales():
    lines = [{"program": "train_step", "rows": 1, "m": {"a b": 0.25}}, {"program": "train_step", "rows": 2, "m": {}},
             {"program": "decode", "xs": [1.0, 2.0, 6.0]}]
    assert evaluate(lines, '[program=train_step,rows=1].m."a b"') == 0.25
    assert evaluate(lines, "mean([program=decode].xs) / [program=decode].xs[-1]") == 0.5
    assert evaluate(lines, "max([program=decode].xs) - min([program=decode].xs)") == 5.0
    with pytest.raises(KeyError, match="selects 2 elements"):
        evaluate(lines, "[program=train_step].rows")
    assert evaluate({"runs": [{"s": 1}, {"s": 3}]}, "sum(runs[*].s)") == 4
    assert evaluate({"s": 12.0}, "60 / s") == 5.0
    abc = {"a": 8.0, "b": 4.0, "c": 2.0, "a - b": 1.0}
    assert evaluate(abc, "a / b / c") == 1.0 and evaluate(abc, "a - b - c") == 2.0      # left to right
    assert evaluate(abc, "a - b / c") == 6.0 and evaluate(abc, "a + b * c") == 16.0     # * / before + -
    assert evaluate(abc, "(a - b) / c") == 2.0 and evaluate(abc, "a / (b / c)") == 4.0  # groups
    assert evaluate(abc, '"a - b" * c') == 2.0                                          # a quoted name
    assert evaluate({"xs": [1.0, 3.0]}, "mean(xs) * (xs[1] - xs[-2])") == 4.0
    assert shown("9,800") == (9800, 50) and shown("70") == (70, 0.5) and shown("\u22126.7") == (-6.7, 0.05)
    assert scale_of("×100") == 100 and scale_of("÷1e9") == 1e-9 and scale_of("÷2^30") == 2 ** -30
    assert cells("| a \\| b | `c` |") == ["a | b", "c"]


@pytest.mark.parametrize("rel", BOUND_DOCS)
def test_every_number_in_the_doc_is_a_checked_figure_or_a_listed_non_measurement(rel):
    unbound = unbound_numbers(rel, _doc(rel), FIGURES, NOT_MEASUREMENTS)
    assert not unbound, "\n".join(unbound)


def section(rel: str, heading: str) -> str:
    """The text of doc `rel` from its `# heading` or `## heading` line to the next `## ` heading."""
    with open(os.path.join(REPO, rel)) as f:
        found = re.search(rf"^##? {re.escape(heading)}\s*$.*?(?=^## |\Z)", f.read(), re.M | re.S)
    assert found, f"{rel} has no '## {heading}' section: update BOUND_SECTIONS"
    return found.group()


@pytest.mark.parametrize("rel, heading", BOUND_SECTIONS)
def test_every_number_in_a_bound_section_is_a_checked_figure_or_a_listed_non_measurement(rel, heading):
    unbound = unbound_numbers(rel, _doc(rel, section(rel, heading)), FIGURES, NOT_MEASUREMENTS)
    assert not unbound, "\n".join(unbound)


def test_every_listed_non_measurement_is_still_said_and_holds_a_number():
    for e in NOT_MEASUREMENTS:
        assert e["why"], f"`## Not measurements` '{e['text']}' in {e['doc']}: say why it is no result"
        assert NUMBER.search(e["text"]), f"`## Not measurements` '{e['text']}' holds no number: drop it"
        assert any(normalise(e["text"]) in b for b in _doc(e["doc"])), (
            f"`## Not measurements` '{e['text']}': {e['doc']} no longer says it: drop or update the entry")


# The three mutations of README (issue 44.2: two figures swapped, a count in prose changed, settings
# changed; all three passed before quotes had to name their figure and every number needed a row), a number
# added that nothing holds, and the same kinds in the other bound docs: (doc, old text, new text, a problem the
# checks must then report).
DOC_MUTATIONS = {
    "constT10 and grpo swapped": ("README.md", "constT10 (1/k) 30.3 ± 1.9%, grpo (1/|τ|) 28.0 ± 4.1%",
                                  "constT10 (1/k) 28.0 ± 4.1%, grpo (1/|τ|) 30.3 ± 1.9%",
                                  "row 'readme-front-paper-constT10': README.md has no line saying"),
    "16 browsers become 64": ("README.md", "16 browsers", "64 browsers", "README.md: 64 in"),
    "horizons 10/20/30 become 100/200/300": ("README.md", "horizons 10/20/30", "horizons 100/200/300",
                                             "README.md: 100 in"),
    "a number no row holds added": ("README.md", "2 CPU cores", "2 CPU cores at 3 GHz", "README.md: 3 in"),
    "fleet: the paper's 64 browsers become 16": ("docs/fleet_model.md", "2.4–2.9×) comes from 64 browsers",
                                                 "2.4–2.9×) comes from 16 browsers",
                                                 "row 'fleet-doc-paper-browsers': docs/fleet_model.md has no line"),
    "fleet: a count in prose changed": ("docs/fleet_model.md", "≈55 s a step", "≈65 s a step",
                                        "row 'fleet-miss-batch64-sync-busy-s': docs/fleet_model.md has no line"),
    "fleet: a number no row holds added": ("docs/fleet_model.md", "every async/sync run measured here",
                                           "every one of the 9 async/sync runs measured here",
                                           "docs/fleet_model.md: 9 in"),
    "learning: a per-seed task success changed": (
        "docs/learning.md", "92.5 / 80.0 / 90.0 / 90.0 / 82.5", "92.5 / 80.0 / 90.0 / 90.0 / 85.5",
        "row 'learning-multiseed-constT10-click-tab-seed0': docs/learning.md"),
    "learning: two gains swapped in prose": ("docs/learning.md", "mostly click-tab (+35 to +38)",
                                             "mostly click-tab (+38 to +35)",
                                             "row 'learning-multiseed-tab-gain-min': docs/learning.md has no line"),
    "scaling: two LoRA temporaries swapped": ("docs/scaling.md", "101, 174, 319 GB", "101, 319, 174 GB",
                                              "row 'pscale-lora-h200-temps-growth-gb': docs/scaling.md has no line"),
    "scaling: a compile time in prose changed": ("docs/scaling.md", "took 821 s here", "took 812 s here",
                                                 "row 'pscale-v6e8-compile-s': docs/scaling.md has no line"),
    "scaling: a number no row holds added": ("docs/scaling.md", "The v5p-32 rows predate both fixes",
                                             "The 7 v5p-32 rows predate both fixes", "docs/scaling.md: 7 in"),
}


@pytest.mark.parametrize("name", DOC_MUTATIONS)
def test_a_swapped_or_changed_figure_of_a_bound_doc_fails(name):
    rel, old, new, expected = DOC_MUTATIONS[name]
    with open(os.path.join(REPO, rel)) as f:
        text = f.read()
    assert doc_problems(rel, text) == []
    assert text.count(old) == 1, f"{rel} mutation {name!r}: '{old}' is not in {rel} once: rewrite it"
    problems = doc_problems(rel, text.replace(old, new))
    assert any(p.startswith(expected) for p in problems), f"{rel} mutation {name!r}: {problems[:3]}"


def test_every_json_under_docs_results_parses():
    for p in glob.glob(os.path.join(RESULTS_DIR, "**", "*.json*"), recursive=True):
        if os.path.getsize(p):
            load(os.path.relpath(p, RESULTS_DIR))  # raises naming the file's bad line


def test_no_json_under_docs_results_is_empty():
    empty = [os.path.relpath(p, RESULTS_DIR) for p in glob.glob(os.path.join(RESULTS_DIR, "**", "*.json*"),
                                                                   recursive=True) if os.path.getsize(p) == 0]
    assert not empty, f"empty JSON under docs/results/: {empty}: rerun the command docs/results.md names for each"
