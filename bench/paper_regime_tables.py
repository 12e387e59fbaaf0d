r"""The paper regime's tables as docs/learning.md shows them, and their docs/results.md figure rows, from an ablation
JSON (bench/ablation.py --json): so the doc's numbers are printed from the evidence, never typed.

    python bench/paper_regime_tables.py docs/results/paper_regime/ablation.json              # markdown
    python bench/paper_regime_tables.py docs/results/paper_regime/ablation_trap.json --rows  # results.md rows

Markdown: the per-arm table (success mean ± SE over seeds, the gain over the warm start, success per difficulty
split, mean steps of successes / failures, the fraction of failures that ran to the horizon, memory characters a
step), each seed's held-out success, the between-arm differences (overall and per split) and the clip line.
`--rows`: one `## Figures` row of docs/results.md per number, named `<prefix>-...` (`--prefix`, default from the
file name: learning-paper or learning-paper-trap), quoting the whole markdown line it appears on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

SPLITS = ("easy", "medium", "hard")
NAMES = {"constT10": "SFT + constT10 (1/k)", "grpo": "SFT + grpo (1/\\|τ\\|)",
         "raftpp": "SFT + raftpp (success-filtered cloning)"}
HEADER = ("| held out (60 episodes a seed, T = 1) | seeds | success, mean ± SE | − warm start, mean ± SE "
          "| easy (H = 10) | medium (H = 20) | hard (H = 30) | steps of successes / failures "
          "| failures at the horizon | memory characters a step |")


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def signed(x: float) -> str:
    """A difference in points, with a real minus sign: +4.6, −1.3."""
    shown = round(100 * x, 1)   # the sign of what is shown: -1e-17 is +0.0, not −0.0
    return ("+" if shown >= 0 else "−") + f"{abs(shown):.1f}"


def se_text(x: float | None) -> str:
    """An SE in points, or "n/a" (one seed has none)."""
    return "n/a" if x is None else f"{100 * x:.1f}"


def with_se(text: str, se: float | None, unit: str = "") -> str:
    """ "30.3 ± 1.9%", or "30.3%" where there is no SE (one seed)."""
    return f"{text}{unit}" if se is None else f"{text} ± {se_text(se)}{unit}"


def seed_mean(seeds: list[dict], field: str, split: str | None = None) -> float:
    return statistics.mean(s["success_by_split"][split] if split else s[field] for s in seeds)


class Tables:
    """Markdown lines and their figure rows for one ablation JSON (`rel`: its path under docs/results/)."""

    def __init__(self, data: dict, rel: str, prefix: str, doc: str = "docs/learning.md"):
        self.d, self.rel, self.prefix, self.doc = data, rel, prefix, doc
        self.rows: list[str] = []
        self.arms = {arm: a for arm, a in data["arms"].items() if a.get("seeds")}   # a stopped run: arms with seeds

    def _row(self, name: str, value, scale: str, key: str, line: str, quote: str | None = None) -> None:
        """One figure row; its quote is the whole markdown `line` unless given."""
        quote = quote or line.replace("\\|", "|").strip("|- ").replace("|", "\\|")
        self.rows.append(f"| {self.prefix}-{name} | measured | {value} | {scale} | {self.rel} | {key} | {self.doc} "
                         f"| {quote} |")

    def arm_table(self) -> list[str]:
        sft = self.d["after_sft"]
        line = (f"| SFT warm start | 1 | {pct(sft['success'])}% | | {100 * sft['splits']['easy']:.0f} | "
                f"{100 * sft['splits']['medium']:.0f} | {100 * sft['splits']['hard']:.0f} | "
                f"{sft['steps_success']:.1f} / {sft['steps_failure']:.1f} | {100 * sft['failures_at_horizon']:.0f}% | "
                f"{sft['memory_chars']:.1f} |")
        out = [HEADER, "|" + "---|" * 10, line]
        self._row("sft", pct(sft["success"]), "×100", "after_sft.success", line)
        for split in SPLITS:
            self._row(f"sft-{split}", f"{100 * sft['splits'][split]:.0f}", "×100", f"after_sft.splits.{split}", line)
        self._row("sft-steps-success", f"{sft['steps_success']:.1f}", "×1", "after_sft.steps_success", line)
        self._row("sft-steps-failure", f"{sft['steps_failure']:.1f}", "×1", "after_sft.steps_failure", line)
        for arm, a in self.arms.items():
            s, seeds = a["summary"], a["seeds"]
            split = {k: seed_mean(seeds, "", k) for k in SPLITS}
            steps_ok, steps_fail = seed_mean(seeds, "mean_steps_success"), seed_mean(seeds, "mean_steps_failure")
            horizon, memory = seed_mean(seeds, "failures_at_horizon"), seed_mean(seeds, "memory_chars_mean")
            line = (f"| {NAMES.get(arm, arm)}, {self.d['steps']} updates | {len(seeds)} | "
                    f"{with_se(pct(s['rl_success_mean']), s['rl_success_se'], '%')} | "
                    f"{with_se(signed(s['diff_mean']), s['diff_se'])} | "
                    f"{pct(split['easy'])} | {pct(split['medium'])} | {pct(split['hard'])} | "
                    f"{steps_ok:.1f} / {steps_fail:.1f} | {100 * horizon:.0f}% | {memory:.1f} |")
            out.append(line)
            base = f"arms.{arm}"
            self._row(f"{arm}-n", len(seeds), "×1", f"len({base}.seeds)", line)
            self._row(f"{arm}-mean", pct(s["rl_success_mean"]), "×100", f"{base}.summary.rl_success_mean", line)
            if s["rl_success_se"] is not None:
                self._row(f"{arm}-se", se_text(s["rl_success_se"]), "×100", f"{base}.summary.rl_success_se", line)
            self._row(f"{arm}-gain", signed(s["diff_mean"]), "×100", f"{base}.summary.diff_mean", line)
            if s["diff_se"] is not None:
                self._row(f"{arm}-gain-se", se_text(s["diff_se"]), "×100", f"{base}.summary.diff_se", line)
            for k in SPLITS:
                self._row(f"{arm}-{k}", pct(split[k]), "×100", f"mean({base}.seeds[*].success_by_split.{k})", line)
            self._row(f"{arm}-steps-success", f"{steps_ok:.1f}", "×1", f"mean({base}.seeds[*].mean_steps_success)",
                      line)
            self._row(f"{arm}-steps-failure", f"{steps_fail:.1f}", "×1", f"mean({base}.seeds[*].mean_steps_failure)",
                      line)
            self._row(f"{arm}-at-horizon", f"{100 * horizon:.0f}", "×100",
                      f"mean({base}.seeds[*].failures_at_horizon)", line)
            self._row(f"{arm}-memory", f"{memory:.1f}", "×1", f"mean({base}.seeds[*].memory_chars_mean)", line)
        return out

    def seed_lines(self) -> list[str]:
        out = []
        for arm, a in self.arms.items():
            line = (f"- {arm}, seeds {', '.join(str(x['seed']) for x in a['seeds'])}: "
                    f"{', '.join(pct(x['success']) for x in a['seeds'])}% held out")
            out.append(line)
            for x in a["seeds"]:
                self._row(f"{arm}-seed{x['seed']}", pct(x["success"]), "×100",
                          f"arms.{arm}.seeds[seed={x['seed']}].success", line)
        return out

    def difference_table(self) -> list[str]:
        out = ["| arms | overall | per split |", "|---|---|---|"]
        by_split = self.d["split_differences"]
        for pair, v in self.d["arm_differences"].items():
            parts = "; ".join(f"{k} {with_se(signed(by_split[k][pair]['diff_mean']), by_split[k][pair]['diff_se'])}"
                              for k in SPLITS)
            line = f"| {pair.replace(' - ', ' − ')} | {with_se(signed(v['diff_mean']), v['diff_se'])} | {parts} |"
            out.append(line)
            name = pair.replace(" - ", "-minus-")
            per_split = [(f"-{k}", by_split[k][pair], f'split_differences.{k}."{pair}"') for k in SPLITS]
            for suffix, diff, key in [("", v, f'arm_differences."{pair}"'), *per_split]:
                self._row(f"{name}{suffix}", signed(diff["diff_mean"]), "×100", f"{key}.diff_mean", line)
                if diff["diff_se"] is not None:
                    self._row(f"{name}{suffix}-se", se_text(diff["diff_se"]), "×100", f"{key}.diff_se", line)
        return out

    def clip_line(self) -> str:
        clip = {arm: seed_mean(a["seeds"], "clip_mean") for arm, a in self.arms.items()}
        line = ("- Clipped tokens an update (`clip_mean`, mean over seeds): "
                + ", ".join(f"{arm} {pct(c)}%" for arm, c in clip.items()) + ".")
        for arm, c in clip.items():
            self._row(f"{arm}-clip", pct(c), "×100", f"mean(arms.{arm}.seeds[*].clip_mean)", line, f"{arm} {pct(c)}%")
        return line

    def length_ratio_line(self) -> str:
        """The trained batches' failures over successes in steps, per seed (the ratio the two normalisers weigh;
        a record made before the curve carried the batches' lengths has none)."""
        key = "train_failure_success_length_ratio"
        parts = []
        for arm, a in self.arms.items():
            seeds = [x for x in a["seeds"] if x.get(key) is not None]
            if not seeds:
                continue
            part = (f"{arm} {', '.join(f'{x[key]:.2f}' for x in seeds)} "
                    f"(seed{'s' if len(seeds) > 1 else ''} {', '.join(str(x['seed']) for x in seeds)})")
            parts.append((arm, seeds, part))
        line = (f"- Trained batches' mean steps of failures over successes (`{key}`): "
                + "; ".join(p for _, _, p in parts) + ".")
        for arm, seeds, part in parts:
            for x in seeds:
                self._row(f"{arm}-seed{x['seed']}-length-ratio", f"{x[key]:.2f}", "×1",
                          f"arms.{arm}.seeds[seed={x['seed']}].{key}", line, part)
        return line if parts else ""

    def markdown(self) -> str:
        """Every table and line; `rows` then holds their figure rows (rebuilt on each call)."""
        self.rows = []
        return "\n".join([*self.arm_table(), "", "Each seed's held-out success:", "", *self.seed_lines(), "",
                          "Between arms (difference of the seed means ± SE), overall and per difficulty split:", "",
                          *self.difference_table(), "", self.clip_line(), self.length_ratio_line()]).rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="an ablation JSON under docs/results/")
    parser.add_argument("--rows", action="store_true", help="print docs/results.md figure rows instead")
    parser.add_argument("--prefix", default=None, help="figure-name prefix (default: from the file name)")
    parser.add_argument("--doc", default="docs/learning.md", help="the doc the rows quote")
    args = parser.parse_args()
    with open(args.json, encoding="utf-8") as f:
        data = json.load(f)
    rel = os.path.relpath(os.path.abspath(args.json), os.path.abspath("docs/results"))
    prefix = args.prefix or ("learning-paper-trap" if "trap" in os.path.basename(args.json) else "learning-paper")
    tables = Tables(data, rel, prefix, args.doc)
    text = tables.markdown()
    print("\n".join(tables.rows) if args.rows else text)


if __name__ == "__main__":
    main()
