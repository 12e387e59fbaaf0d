"""Pick the remat policy of a run from the ahead-of-time memory fit, per scale, instead of one global "full".

    fit = remat_fit.fit(config, model_config, mesh, chip, topology, shapes, headroom=0.1)
    fit["choice"]        # "none", "minimal", ..., "full", or None: not even "full" fits

The train step is compiled (`train/aot.py`, for the slice's compile-only TPU devices or one CPU device) under each
named policy in order of least recompute (`models/layers.REMAT_POLICIES`: every policy keeps less than the one
before and recomputes more), until one fits: its bytes per device (XLA's `memory_analysis` total, plus the train
state the Updater holds besides the step's arguments) at most the chip's HBM less `headroom` (a fraction kept free
for what XLA's analysis does not see: the runtime's own buffers, fragmentation). The report lists every policy
tried with its bytes, so a recipe's choice is read from it (`launch/compile.py --fit_remat`).
"""

from __future__ import annotations

from jaxwebrl.models.layers import REMAT_POLICIES
from jaxwebrl.parallel.topology import Chip
from jaxwebrl.train import aot


def budget_bytes(chip: Chip, headroom: float) -> float:
    """The bytes a policy may take per device: the chip's HBM less the `headroom` fraction (0 <= headroom < 1)."""
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"remat headroom={headroom} must be a fraction in [0, 1): the share of HBM kept free")
    return chip.hbm_bytes * (1.0 - headroom)


def pick(needed: dict[str, float | None], budget: float) -> str | None:
    """The first policy, in REMAT_POLICIES order, whose `needed` bytes per device (None: XLA refused it) are at most
    `budget`; None when none does. Policies missing from `needed` are skipped."""
    for policy in REMAT_POLICIES:
        if needed.get(policy) is not None and needed[policy] <= budget:
            return policy
    return None


def _tried(policy: str, report: dict, budget: float) -> dict:
    """One policy's line of the fit: its program bytes (None where XLA refused it), the held train state, the sum."""
    hbm = report["hbm_bytes_per_device"]
    held = (report.get("hbm_resident_bytes_per_device") or {}).get("total", 0)
    needed = None if report.get("error") else hbm["total"] + held
    return {"remat": policy, "temporaries": hbm["temporaries"], "total": hbm["total"], "held": held,
            "needed": needed, "fits": needed is not None and needed <= budget, "compile_s": report["compile_s"]}


def fit(config, model_config, mesh, chip: Chip, topology: str, shapes: aot.RunShapes, *, headroom: float,
        knobs: dict | None = None, policies=tuple(REMAT_POLICIES), stop_at_fit: bool = True) -> tuple[dict, dict]:
    """Compile the train step under `policies` (REMAT_POLICIES order) until one fits the chip less `headroom`
    (all of them with `stop_at_fit=False`). Returns (the JSON report: {"program": "remat_fit", topology, chip,
    rows, seq_len, headroom, budget_bytes, tried: [{remat, temporaries, total, held, needed, fits, compile_s}],
    choice}, {policy: its train_step report (`aot.report`)})."""
    unknown = [p for p in policies if p not in REMAT_POLICIES]
    if unknown:
        raise ValueError(f"unknown remat policies {unknown}: use some of {', '.join(REMAT_POLICIES)}")
    budget = budget_bytes(chip, headroom)
    tried, reports = [], {}
    for policy in sorted(policies, key=list(REMAT_POLICIES).index):
        (reports[policy],) = aot.compile_programs(config, model_config.replace(remat=policy), mesh, chip, topology,
                                                  shapes, ("train_step",), {**(knobs or {}), "remat": policy})
        tried.append(_tried(policy, reports[policy], budget))
        if tried[-1]["fits"] and stop_at_fit:
            break
    choice = pick({t["remat"]: t["needed"] for t in tried}, budget)
    return ({"program": "remat_fit", "topology": topology, "chip": chip.name, "rows": shapes.rows,
             "seq_len": shapes.seq_len, "headroom": headroom, "budget_bytes": budget, "tried": tried,
             "choice": choice}, reports)
