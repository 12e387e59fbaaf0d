"""The JSON object a bench script printed, the record bench/bench_table.sh keeps of it, and how a bench rounds a
time for it.

    python bench/bench_json.py STDOUT_FILE OUT_JSON COMMAND COMMIT WALL_S   # writes OUT_JSON with a "measured" field
"""

from __future__ import annotations

import json
import os
import platform
import sys


def last_json(stdout: str) -> dict:
    """The last JSON object in a bench's stdout: one line, or indented (its opening brace alone at column 0)."""
    lines = stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("{"))
    return json.loads("\n".join(lines[start:]))


def significant(t: float, digits: int = 4) -> float:
    """A time to `digits` significant digits: a fixed number of decimals keeps 1 or 2 digits of a time of a few
    ms (or us), and a ratio recomputed from the printed times is then off by several percent."""
    return float(f"{float(t):.{digits}g}")


def main() -> None:
    stdout_file, out, command, commit, wall_s = sys.argv[1:]
    with open(stdout_file, encoding="utf-8") as f:
        result = last_json(f.read())
    result["measured"] = {"command": "python3 " + command, "commit": commit, "cpu_count": os.cpu_count(),
                          "machine": platform.platform(), "wall_s": int(wall_s)}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
