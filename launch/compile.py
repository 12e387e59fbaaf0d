r"""Compile a recipe's real programs for a TPU slice on this machine, and say whether they fit and how fast they
could run: `python launch/compile.py --config=configs/constT10.py:qwen3vl_8b --topology=v5p-8 [--config.a.b=v]`.

Prints one JSON object per program (train_step, proximal_logprobs, prefill, decode, logprob_path, and in a KL run
reference_logprobs, with a critic critic_values and critic_step; see `jaxwebrl/train/aot.py`):
`hbm_bytes_per_device` {arguments, outputs, temporaries, total} from XLA against
`hbm_capacity_bytes`, `fits`, analytic `flops` and `model_flops` per chip, `predicted_step_s` (roofline at the
chip's published bf16 peak and HBM bandwidth), `roofline_flops_utilisation` (model FLOPs / (roofline step time x
chip peak): a bound from XLA's analysis, not a measured MFU) and `compile_s`. The config's own mesh
(`distributed.mesh`; unset: data over hosts, fsdp over the rest) and partition rules are used; nothing is
allocated and no accelerator is needed, only libtpu (`pip install -e ".[tpu]"`).

Exit status: 0 when every program fits; 1 with one line per program that does not (bytes needed, bytes available,
the knobs that change it); 2 for a bad flag, an unknown topology or a missing libtpu (one line naming the fix).

  --rows_per_chip=N  train rows per batch shard (default 1: one 16k-token row per chip at paper scale)
  --programs=a,b     a subset of the programs (default: every program the config's run executes)
  --find_fit         also search the largest train rows_per_chip x max_seq_len that fit (halving max_seq_len)
  --fit_remat        first pick the remat policy: the train step compiled under each named policy, least
                     recompute first, until one fits the chip less --remat_headroom (default 0.1 of HBM); prints a
                     `remat_fit` line (every policy tried, its bytes, the choice) and compiles the programs under it
                     (`jaxwebrl/train/remat_fit.py`)
  --out=FILE         also write the JSON lines to FILE

--topology=h200-1 (or h100-1) models one 141 GB (80 GB) GPU-sized device: the programs compile for one device of
this machine's CPU backend (no TPU, no GPU), and XLA's memory analysis of that compile is compared with the chip's
HBM; the roofline uses its published peak and bandwidth. The CPU compiler's buffer assignment is not the GPU's
(its fusion differs): the bytes are an estimate of the GPU's, not a GPU compile.
"""

import itertools
import json
import math
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")     # compile-only TPU devices need no backend; keep JAX on the CPU

# E402 below: nothing may import JAX before JAX_PLATFORMS is set
import jax  # noqa: E402
from absl import app, flags  # noqa: E402

from jaxwebrl import cli  # noqa: E402
from jaxwebrl.models import presets  # noqa: E402
from jaxwebrl.parallel import compile_cache, distributed, multihost  # noqa: E402
from jaxwebrl.parallel.topology import CHIPS, Topology, TopologyError, topology_devices  # noqa: E402
from jaxwebrl.train import aot, remat_fit  # noqa: E402

_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU slice, e.g. v5e-8, v5p-8, v6e-8, v5p-32")
_PROGRAMS = flags.DEFINE_string("programs", None, "comma-separated programs to compile (default: all the run's)")
_ROWS = flags.DEFINE_integer("rows_per_chip", 1, "train rows per batch shard of the mesh")
_FIND_FIT = flags.DEFINE_bool("find_fit", False, "search the largest train rows_per_chip x max_seq_len that fit")
_OUT = flags.DEFINE_string("out", None, "also write the JSON lines to this file")
_FIT_REMAT = flags.DEFINE_bool("fit_remat", False, "pick the remat policy: the least recompute whose train step fits")
_HEADROOM = flags.DEFINE_float("remat_headroom", 0.1, "--fit_remat: share of the chip's HBM kept free")


# One GPU-sized device modelled on the CPU backend (see the module docstring): name -> key of CHIPS.
CPU_BUDGETS = {"h100-1": "h100", "h200-1": "h200"}


def devices_of(name: str) -> tuple[list, Topology]:
    """(devices to compile for, their Topology): a TPU slice's compile-only devices, or one CPU device for a
    CPU_BUDGETS name."""
    if name in CPU_BUDGETS:
        return jax.devices("cpu")[:1], Topology(name, CPU_BUDGETS[name], "cpu:1")
    return topology_devices(name)


def knobs_of(config, mesh) -> dict:
    m = config.model
    return {"dtype": m.dtype, "param_dtype": m.param_dtype or m.dtype,
            "moments_dtype": config.train.moments_dtype or m.param_dtype or m.dtype, "remat": m.remat,
            "scan_layers": bool(m.scan_layers), "attention_chunk": int(m.attention_chunk),
            "attention_impl": m.attention_impl,
            "logits_chunk": int(m.logits_chunk), "mesh": dict(mesh.shape),
            "lora": None if m.lora.rank is None else {"rank": m.lora.rank, "alpha": m.lora.alpha,
                                                      "target_modules": m.lora.target_modules,
                                                      "base_dtype": m.lora.base_dtype},
            "freeze_vision": bool(m.freeze_vision)}


def advice(report: dict, config, rows_per_chip: int) -> str:
    """One line: program, bytes needed and available, and the knobs that would change it."""
    resident = report.get("hbm_resident_bytes_per_device") or {}
    need = ((report["hbm_bytes_per_device"]["total"] or 0) + resident.get("total", 0)) / 1e9
    at_least = "at least " if report.get("error") else ""
    have = report["hbm_capacity_bytes"] / 1e9
    mesh = ", ".join(f"{k}={v}" for k, v in report["knobs"]["mesh"].items())
    state = report.get("state_bytes_per_device", 0) / 1e9
    if state >= have:
        knobs = report["knobs"]
        chips = math.ceil(state * knobs["mesh"]["fsdp"] * knobs["mesh"]["tensor"] / have)
        return (f"{report['program']} cannot fit {report['topology']} at any row length: the weights, gradients and "
                f"AdamW moments alone need {state:.2f} GB per device ({knobs['param_dtype']} weights, "
                f"{knobs['moments_dtype']} moments), {have:.2f} GB available, so at least {chips} chips of this kind; "
                f"use a slice with more HBM in all, or --config.model.param_dtype=bfloat16 "
                f"--config.train.moments_dtype=bfloat16")
    if report["program"] in ("prefill", "decode"):
        levers = (f"--config.rollout.server_max_batch (now {config.rollout.server_max_batch}), "
                  f"--config.buffer.max_seq_len (now {config.buffer.max_seq_len}), --config.distributed.mesh.* "
                  f"(now {mesh}), --config.model.param_dtype=bfloat16")
    else:
        levers = (f"--rows_per_chip (now {rows_per_chip}), --config.buffer.max_seq_len (now "
                  f"{config.buffer.max_seq_len}), --config.model.remat (now {config.model.remat}; --fit_remat "
                  f"picks one), --config.distributed.mesh.* (now {mesh}), --config.model.param_dtype / "
                  f"--config.train.moments_dtype")
    if resident.get("reference"):
        levers += (f", --config.actor.ref_dtype (now {config.actor.ref_dtype}) / --config.actor.ref_offload=True "
                   f"(the reference holds {resident['reference'] / 1e9:.2f} GB)")
    return (f"{report['program']} does not fit {report['topology']}: needs {at_least}{need:.2f} GB per device, "
            f"{have:.2f} GB available; knobs: {levers}")


def find_fit(config, model_config, mesh, chip, topology, emit, known=None) -> dict:
    """Largest rows_per_chip (doubling) per max_seq_len (halving from the recipe's) whose train step fits.
    known: {(seq_len, rows_per_chip): train_step report} already compiled (not compiled again)."""
    known, found, seq = known or {}, [], int(config.buffer.max_seq_len)
    held = aot.Programs(config, model_config, mesh, aot.RunShapes.of(config, model_config, mesh))
    floor = held.state_bytes_per_device() + held.resident_bytes("train_step")["total"]
    if floor >= chip.hbm_bytes:   # no row of any length fits: compile nothing
        return {"program": "train_step_fit", "topology": topology, "largest_fit": None, "tried": [],
                "state_and_held_bytes_per_device": floor,
                "reason": f"the train state alone needs {floor / 1e9:.2f} GB per device, {chip.hbm_bytes / 1e9:.2f} GB "
                          f"available"}
    while True:
        try:
            aot.RunShapes.of(config, model_config, mesh, seq_len=seq)
        except ValueError:
            break
        best, rows = 0, 1
        while True:
            if (seq, rows) in known:
                report = known[(seq, rows)]
            else:
                shapes = aot.RunShapes.of(config, model_config, mesh, rows_per_chip=rows, seq_len=seq)
                (report,) = aot.compile_programs(config, model_config, mesh, chip, topology, shapes, ("train_step",),
                                                 knobs_of(config, mesh))
            emit({"search": "train_step", "seq_len": seq, "rows_per_chip": rows, "fits": report["fits"],
                  "hbm_total_bytes": report["hbm_bytes_per_device"]["total"],
                  "roofline_flops_utilisation": report.get("roofline_flops_utilisation"),
                  "compile_s": report["compile_s"]})
            if not report["fits"]:
                break
            best, rows = rows, rows * 2
            if rows > 64:   # enough rows per chip: stop doubling
                break
        found.append({"seq_len": seq, "rows_per_chip": best, "tokens_per_chip": best * seq})
        if best:
            break
        seq //= 2
    largest = max(found, key=lambda f: f["tokens_per_chip"])
    return {"program": "train_step_fit", "topology": topology, "largest_fit": largest, "tried": found}


def main(argv) -> int:
    del argv
    if not _TOPOLOGY.value:
        cli.exit_with("usage error: --config=configs/X.py:variant and --topology=v5p-8 are required", 2)
    config = cli.loaded_config(code=2)
    try:
        devices, topology = devices_of(_TOPOLOGY.value)
    except TopologyError as err:
        cli.exit_with(str(err), 2)
    if _TOPOLOGY.value not in CPU_BUDGETS:
        compile_cache.disable()   # a TPU slice's programs: written to the cache, never loadable from it here
    programs = [p for p in _PROGRAMS.value.split(",") if p] if _PROGRAMS.value else list(aot.programs_for(config))
    unknown = [p for p in programs if p not in aot.PROGRAMS]
    if unknown:
        cli.exit_with(f"usage error: unknown programs {unknown}: use some of {', '.join(aot.PROGRAMS)}", 2)
    runs = aot.programs_for(config)
    for p in programs:
        if p not in runs:
            cli.exit_with(f"usage error: this config's run has no {p} program: it needs {aot.OPTIONAL[p][1]}", 2)
    try:
        model_config = presets.shapes_config(config.model)
        hosts = len({d.process_index for d in devices})
        sizes = multihost.mesh_sizes(config.distributed, hosts) or {"data": 1, "fsdp": -1, "tensor": 1}
        mesh = distributed.process_mesh(sizes, devices)
        shapes = aot.RunShapes.of(config, model_config, mesh, rows_per_chip=_ROWS.value)
    except (ValueError, KeyError, FileNotFoundError) as err:
        cli.exit_with(f"config error: {' '.join(str(err).split())}", 2)
    chip = CHIPS[topology.chip]
    out = open(_OUT.value, "w", encoding="utf-8") if _OUT.value else None

    def emit(obj):
        line = json.dumps(obj)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    failed, known, fitted = [], {}, {}
    if _FIT_REMAT.value:
        try:
            fit, fitted = remat_fit.fit(config, model_config, mesh, chip, topology.name, shapes,
                                        headroom=_HEADROOM.value, knobs=knobs_of(config, mesh))
        except ValueError as err:
            cli.exit_with(f"usage error: {err}", 2)
        emit(fit)
        if fit["choice"] is None:
            last = fit["tried"][-1]
            need = "more than the chip" if last["needed"] is None else f"{last['needed'] / 1e9:.2f} GB per device"
            cli.exit_with(f"no remat policy fits {topology.name}: even {last['remat']!r} needs {need}, "
                          f"{fit['budget_bytes'] / 1e9:.2f} GB allowed (--remat_headroom={_HEADROOM.value}); fewer "
                          f"--rows_per_chip, a shorter --config.buffer.max_seq_len or a larger mesh", 1)
        config.model.remat = fit["choice"]
        model_config = model_config.replace(remat=fit["choice"])
    chosen = fitted.get(config.model.remat) if "train_step" in programs else None   # compiled by the fit already
    rest = [p for p in programs if not (chosen and p == "train_step")]
    reports = aot.compile_programs(config, model_config, mesh, chip, topology.name, shapes, rest,
                                   knobs_of(config, mesh))
    for report in itertools.chain([chosen] if chosen else [], reports):
        emit(report)
        if not report["fits"]:
            failed.append(report)
        if report["program"] == "train_step":
            known[(shapes.seq_len, _ROWS.value)] = report
    if _FIND_FIT.value:
        emit(find_fit(config, model_config, mesh, chip, topology.name, emit, known))
    if out:
        out.close()
    for report in failed:
        print(advice(report, config, _ROWS.value), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("config error", code=2))
