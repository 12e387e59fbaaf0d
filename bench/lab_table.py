r"""The JAX lab study's verdicts (issue 43), from its records: each prediction of the paper held, not held or
unresolved, by the rules docs/learning.md fixed before the run ("The JAX lab").

    python3 bench/lab_table.py                        # docs/results/lab/*.json -> a markdown table
    python3 bench/lab_table.py --records=DIR --json   # the same as JSON
    python3 bench/lab_table.py --out=docs/results/lab/verdicts/table.json   # and kept (docs/results.md's rows)

Each record (bench/lab_study.py) holds every seed's endpoint (mean over the last 50 updates) per measure. For a
ratio with both arms, d_s = constT10 − grpo per seed (seeds paired); the table gives mean d, its 95% t-interval,
the minimal detectable effect (80% power, two-sided 5%) and the verdict.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os

from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENDPOINT = "last50"
# prediction -> (measure, scale to the shown unit, predicted sign, smallest effect of interest in the shown unit)
PREDICTIONS = {
    "P1 shorter failures": ("failure_steps", 1.0, -1, 0.5),
    "P2 shorter memory": ("memory_tokens", 1.0, -1, 0.1),
    "P3 success equal or better": ("success", 100.0, 0, 2.0),
    "P5 fewer clipped tokens": ("clip_ratio", 100.0, -1, 0.1),
}
GAP = ("P4 success gap grows with the ratio", "success", 100.0, 1, 2.0)


def interval(values) -> dict:
    """Mean, 95% t half-width, minimal detectable effect and n of the finite values (None where n < 2)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n < 2:
        return {"mean": xs[0] if xs else None, "ci95": None, "mde": None, "n": n}
    mean = sum(xs) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1) / n)
    return {"mean": mean, "ci95": stats.t.ppf(0.975, n - 1) * se, "mde": detectable(se, n), "n": n}


def detectable(se: float, n: int) -> float:
    """The minimal detectable effect of a mean over n paired seeds with standard error `se`: 80% power, two-sided
    5% (t over n - 1 degrees of freedom for the test, normal for the power)."""
    return (stats.t.ppf(0.975, n - 1) + stats.norm.ppf(0.8)) * se


def verdict(summary: dict, sign: int, sesoi: float) -> str:
    """held / not held / unresolved for a paired difference's interval. sign -1 or +1: the predicted direction;
    0: non-inferiority (held when the lower bound is above -sesoi, not held when the upper bound is below it)."""
    if summary["ci95"] is None:
        return "unresolved"
    low, high = summary["mean"] - summary["ci95"], summary["mean"] + summary["ci95"]
    if sign == 0:
        return "held" if low > -sesoi else "not held" if high < -sesoi else "unresolved"
    if (sign < 0 and high < 0) or (sign > 0 and low > 0):
        return "held"
    if (sign < 0 and low > 0) or (sign > 0 and high < 0) or (-sesoi < low and high < sesoi):
        return "not held"
    return "unresolved"


def load(records_dir: str) -> dict:
    """{(ratio, arm): record} of every finished record in the directory."""
    out = {}
    for path in sorted(glob.glob(os.path.join(records_dir, "*.json"))):
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        out[(record["experiment"]["ratio"], record["experiment"]["arm"])] = record
    return out


def _endpoints(record, measure, scale):
    return [None if v is None else v * scale for v in record["per_seed"][measure][ENDPOINT]]


# what may differ between paired records: an arm's own name and recipe; across ratios, the ratio and the environment
# and horizons it sets
ARM_KEYS, RATIO_KEYS = ("arm", "recipe"), ("ratio", "env", "horizons")


def check_paired(records: list[dict]) -> None:
    """Refuses records that are not paired: every record's experiment must match the first one's in every key but the
    arm's own (ARM_KEYS) and the ratio's (RATIO_KEYS): the same seeds, updates, policy and setup."""
    if not records:
        return
    first = records[0]["experiment"]
    for record in records[1:]:
        other = record["experiment"]
        differ = sorted(k for k in set(first) | set(other)
                        if k not in ARM_KEYS + RATIO_KEYS and first.get(k) != other.get(k))
        if differ:
            raise SystemExit(f"lab_table: {first['arm']} at ratio {first['ratio']} and {other['arm']} at ratio "
                             f"{other['ratio']} differ in {', '.join(differ)}: not paired; rerun one of them "
                             "(bench/lab_study.py) with the other's settings")


def _paired(a, b):
    return [None if x is None or y is None else x - y for x, y in zip(a, b)]


def table(records: dict, arm="constT10", baseline="grpo") -> list[dict]:
    """One row per (prediction, ratio) with its paired interval and verdict."""
    rows = []
    ratios = sorted({r for r, a in records if (r, arm) in records and (r, baseline) in records})
    check_paired([records[(r, name)] for r in ratios for name in (arm, baseline)])
    for name, (measure, scale, sign, sesoi) in PREDICTIONS.items():
        for ratio in ratios:
            a, b = records[(ratio, arm)], records[(ratio, baseline)]
            d = interval(_paired(_endpoints(a, measure, scale), _endpoints(b, measure, scale)))
            rows.append({"id": name.split()[0], "prediction": name, "ratio": ratio, "measure": measure, **d,
                         arm: interval(_endpoints(a, measure, scale))["mean"],
                         baseline: interval(_endpoints(b, measure, scale))["mean"],
                         "verdict": verdict(d, sign, sesoi)})
    name, measure, scale, sign, sesoi = GAP
    if ratios and len(ratios) > 1:
        low, high = ratios[0], ratios[-1]
        gaps = [_paired(_endpoints(records[(r, arm)], measure, scale), _endpoints(records[(r, baseline)], measure, scale))
                for r in (high, low)]
        d = interval(_paired(*gaps))
        rows.append({"id": name.split()[0], "prediction": name, "ratio": f"{high} vs {low}", "measure": measure, **d,
                     arm: None, baseline: None, "verdict": verdict(d, sign, sesoi)})
    return rows


def signed(x, digits=2):
    """A signed number with a real minus sign (−0.34, +4.00), or "" for None."""
    return "" if x is None else f"{x:+.{digits}f}".replace("-", "−")


def markdown(rows, arm="constT10", baseline="grpo") -> str:
    lines = [f"| prediction | ratio | {arm} | {baseline} | {arm} − {baseline} (95% CI) | MDE | seeds | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = "" if r["ci95"] is None else f"{signed(r['mean'])} ± {r['ci95']:.2f}"
        own = "" if r[arm] is None else f"{r[arm]:.2f}"
        base = "" if r[baseline] is None else f"{r[baseline]:.2f}"
        mde = "" if r["mde"] is None else f"{r['mde']:.2f}"
        lines.append(f"| {r['prediction']} | {r['ratio']} | {own} | {base} | {ci} | {mde} | {r['n']} | {r['verdict']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default=os.path.join(ROOT, "docs", "results", "lab"))
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of markdown")
    parser.add_argument("--out", help="also write the rows, the command and each record's commit to this JSON")
    args = parser.parse_args()
    records = load(args.records)
    if not records:
        raise SystemExit(f"lab_table: no records in {args.records}: run bench/lab_study.py first")
    rows = table(records)
    print(json.dumps(rows, indent=1) if args.json else markdown(rows))
    if args.out:
        sources = [{"ratio": r, "arm": a, "commit": rec["commit"], "seeds": len(rec["experiment"]["seeds"]),
                    "updates": rec["experiment"]["updates"]} for (r, a), rec in sorted(records.items())]
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"command": "python3 bench/lab_table.py " + " ".join(
                f"--{k}={v}" for k, v in (("records", args.records), ("out", args.out))),
                "records": sources, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
