r"""Export a trained checkpoint: `python launch/export.py --config=configs/constT10.py[:variant] --policy=WORKDIR
    [--step=N] --hf_out=DIR [--params_out=DIR] [--hf_dtype=bfloat16]`.

--config is the recipe the run was trained with (it names the base model: architecture, tokenizer, processor).
--hf_out writes a Hugging Face safetensors directory (transformers' from_pretrained loads it, logits equal to the
JAX policy); --params_out writes a standalone Orbax params checkpoint (launch/eval.py --policy=DIR reads it).
"""

import json

from absl import app, flags

from jaxwebrl import cli

_POLICY = flags.DEFINE_string("policy", None, "training workdir, its checkpoints/ dir, or a params checkpoint")
_STEP = flags.DEFINE_integer("step", None, "training step to export (default: the latest)")
_HF_OUT = flags.DEFINE_string("hf_out", None, "new directory for the HF safetensors export")
_PARAMS_OUT = flags.DEFINE_string("params_out", None, "new directory for the standalone Orbax params checkpoint")
_HF_DTYPE = flags.DEFINE_string("hf_dtype", None, "storage dtype of the safetensors (default: the params' dtype)")


def main(argv):
    del argv
    if not _POLICY.value:
        raise app.UsageError("--policy is required, e.g. --config=configs/constT10.py:toy --policy=/tmp/run "
                             "--hf_out=/tmp/run_hf")
    config = cli.loaded_config(workdir=_POLICY.value)   # a workdir's config.json, overrides on top
    from jaxwebrl.eval.export import export  # deferred: JAX starts once the flags are known to be good

    try:
        info = export(config, _POLICY.value, step=_STEP.value, hf_out=_HF_OUT.value, params_out=_PARAMS_OUT.value,
                      hf_dtype=_HF_DTYPE.value)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        cli.exit_with(f"export error: {err}")
    print(json.dumps(info, sort_keys=True))


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("config error"))
