"""Export a training checkpoint: an HF safetensors directory (transformers loads it) and standalone Orbax params.

    info = export(config, "WORKDIR", hf_out="out/hf", params_out="out/params")   # launch/export.py

The HF directory is `save_pretrained` of the trained params on the recipe's model (config.json, safetensors,
tokenizer and preprocessor files). The params checkpoint is one Orbax pytree (`params/`) plus
`jaxwebrl_params.json` (step, policy version, source), the layout of `jaxwebrl/checkpoint/layout.py`;
`load_policy(config, DIR)` and `launch/eval.py --policy=DIR` read either back (an HF directory's
`jaxwebrl_export.json` gives the eval report its step and policy version); plain Orbax reads the params:
`ocp.StandardCheckpointer().restore(DIR + "/params")`.
"""

from __future__ import annotations

import json
import os

from jaxwebrl.checkpoint.layout import EXPORT_INFO, save_params
from jaxwebrl.checkpoint.policies import load_policy
from jaxwebrl.models.hf_io import save_pretrained
from jaxwebrl.models.policy import Policy


def save_hf(policy: Policy, out_dir: str, info: dict, *, dtype: str | None = None) -> None:
    """`save_pretrained` of `policy` into `out_dir` (refuses a directory that already holds a model)."""
    if os.path.exists(os.path.join(out_dir, "config.json")):
        raise FileExistsError(f"{out_dir} already holds a model (config.json): choose a new --hf_out directory")
    save_pretrained(policy, out_dir, dtype=dtype)
    with open(os.path.join(out_dir, EXPORT_INFO), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, sort_keys=True)


def export(config, source: str, *, step: int | None = None, hf_out: str | None = None,
           params_out: str | None = None, hf_dtype: str | None = None) -> dict:
    """Load `source` (see `policies.load_policy`) and write what is asked; returns the provenance dict with the
    output paths added."""
    if not hf_out and not params_out:
        raise ValueError("nothing to export: give hf_out (HF safetensors dir) and/or params_out (Orbax params)")
    policy, info = load_policy(config, source, step=step)
    if hf_out:
        save_hf(policy, hf_out, info, dtype=hf_dtype)
        info["hf_out"] = os.path.abspath(hf_out)
    if params_out:
        save_params(policy.params, params_out, {k: v for k, v in info.items() if k != "hf_out"})
        info["params_out"] = os.path.abspath(params_out)
    return info
