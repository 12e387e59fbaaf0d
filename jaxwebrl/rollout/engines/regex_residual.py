"""The regex a generated prefix leaves: what a response that already begins with `prefix` may still emit.

    rest = residual_regex(r"Memory: \\{\\}\\nAction: click\\([0-9], [0-9]\\)", "Memory: {}\\nAction: cl")
    # rest == r"ick\\([0-9], [0-9]\\)": re.fullmatch(rest, q) exactly when re.fullmatch(pattern, prefix + q)

A request interrupted by a weight push is resubmitted as its prompt plus the tokens it had generated; a serving
engine's structured output constrains only the new tokens, from the grammar's start, so the continuation is given
this residual instead (the Brzozowski derivative of the pattern by each character of the prefix). Python `re`
syntax in and out, the subset the action grammar uses (literals, classes, groups, alternation, bounded and unbounded
repetition); `""` when only the empty string remains (the response is complete: only the end token may follow).

No JAX and no numpy: the engine process (`vllm_process`, the engine venv) imports it.
"""

from __future__ import annotations

import functools
import re

try:  # Python >= 3.11 moved the parser
    import re._constants as sre_constants
    import re._parser as sre_parse
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

# Nodes are tuples (hashable, so alternatives dedupe): ("eps",) the empty string, ("none",) no string at all,
# ("chars", regex) one character of a class, ("seq", parts), ("alt", options), ("rep", node, low, high | None).
EPS, NONE = ("eps",), ("none",)
_CATEGORIES = {"CATEGORY_DIGIT": r"\d", "CATEGORY_NOT_DIGIT": r"\D", "CATEGORY_SPACE": r"\s",
               "CATEGORY_NOT_SPACE": r"\S", "CATEGORY_WORD": r"\w", "CATEGORY_NOT_WORD": r"\W"}


def residual_regex(pattern: str, prefix: str) -> str:
    """The regex of the strings q with `re.fullmatch(pattern, prefix + q)`; ValueError when there are none (the
    prefix cannot begin any match of the pattern)."""
    node = _parse(pattern)
    for char in prefix:
        node = _derive(node, char)
        if node == NONE:
            raise ValueError(f"{prefix!r} does not begin any match of the pattern (it leaves at {char!r}); "
                             f"the response was not generated under this grammar")
    return _emit(node)


@functools.lru_cache(maxsize=64)
def _parse(pattern: str) -> tuple:
    return _tree(sre_parse.parse(pattern))


def _tree(items) -> tuple:
    return _seq([_node(op, arg) for op, arg in items])


def _node(op, arg) -> tuple:
    c = sre_constants
    if op is c.LITERAL:
        return ("chars", re.escape(chr(arg)))
    if op is c.NOT_LITERAL:
        return ("chars", f"[^{re.escape(chr(arg))}]")
    if op is c.ANY:
        return ("chars", ".")
    if op is c.IN:
        return ("chars", _class(arg))
    if op is c.SUBPATTERN:
        return _tree(arg[-1])
    if op is c.BRANCH:
        return _alt([_tree(alternative) for alternative in arg[1]])
    if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)):
        low, high, sub = arg
        return _rep(_tree(sub), low, None if high == c.MAXREPEAT else high)
    if op is c.AT:
        return EPS   # anchors: the whole text is matched anyway
    raise ValueError(f"regex feature {op} is not supported by residual_regex (use literals, classes, groups, "
                     f"alternation and repetition)")


def _class(items) -> str:
    """A character class's regex, e.g. `[a-z0-9]`, from its parse items."""
    c, parts = sre_constants, []
    for op, arg in items:
        if op is c.NEGATE:
            parts.insert(0, "^")
        elif op is c.LITERAL:
            parts.append(re.escape(chr(arg)))
        elif op is c.RANGE:
            parts.append(f"{re.escape(chr(arg[0]))}-{re.escape(chr(arg[1]))}")
        elif op is c.CATEGORY and str(arg) in _CATEGORIES:
            parts.append(_CATEGORIES[str(arg)])
        else:
            raise ValueError(f"character class item {op} {arg} is not supported by residual_regex")
    return "[" + "".join(parts) + "]"


# Smart constructors keep the derivatives small: no empty parts, no nested sequences or alternations, no duplicate
# alternatives, no repetition of the empty string.
def _seq(parts) -> tuple:
    flat = []
    for part in parts:
        if part == NONE:
            return NONE
        if part != EPS:
            flat.extend(part[1] if part[0] == "seq" else (part,))
    return EPS if not flat else flat[0] if len(flat) == 1 else ("seq", tuple(flat))


def _alt(options) -> tuple:
    flat: list = []
    for option in options:
        for o in (option[1] if option[0] == "alt" else (option,)):
            if o != NONE and o not in flat:
                flat.append(o)
    return NONE if not flat else flat[0] if len(flat) == 1 else ("alt", tuple(flat))


def _rep(node: tuple, low: int, high: int | None) -> tuple:
    if high == 0 or node == EPS:
        return EPS
    if node == NONE:
        return EPS if low == 0 else NONE
    return node if (low, high) == (1, 1) else ("rep", node, low, high)


def _nullable(node: tuple) -> bool:
    kind = node[0]
    if kind in ("eps", "none", "chars"):
        return kind == "eps"
    if kind == "seq":
        return all(map(_nullable, node[1]))
    if kind == "alt":
        return any(map(_nullable, node[1]))
    return node[2] == 0 or _nullable(node[1])


@functools.lru_cache(maxsize=4096)
def _derive(node: tuple, char: str) -> tuple:
    """The strings q with char + q in node (the derivative)."""
    kind = node[0]
    if kind in ("eps", "none"):
        return NONE
    if kind == "chars":
        return EPS if re.fullmatch(node[1], char) else NONE
    if kind == "seq":
        head, rest = node[1][0], _seq(node[1][1:])
        first = _seq([_derive(head, char), rest])
        return _alt([first, _derive(rest, char)]) if _nullable(head) else first
    if kind == "alt":
        return _alt([_derive(option, char) for option in node[1]])
    sub, low, high = node[1], node[2], node[3]
    return _seq([_derive(sub, char), _rep(sub, max(low - 1, 0), None if high is None else high - 1)])


def _emit(node: tuple) -> str:
    kind = node[0]
    if kind == "eps":
        return ""
    if kind == "chars":
        return node[1]
    if kind == "seq":
        return "".join(f"({_emit(p)})" if p[0] == "alt" else _emit(p) for p in node[1])
    if kind == "alt":
        return "|".join(_emit(option) for option in node[1])
    sub, low, high = node[1], node[2], node[3]
    atom = sub[1] if sub[0] == "chars" else f"({_emit(sub)})"
    if (low, high) == (0, 1):
        return atom + "?"
    if high is None:
        return atom + ("*" if low == 0 else "+" if low == 1 else f"{{{low},}}")
    return atom + (f"{{{low}}}" if low == high else f"{{{low},{high}}}")
