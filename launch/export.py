r"""Export a trained checkpoint: `python launch/export.py --config=configs/constT10.py[:variant] --policy=WORKDIR
    [--step=N] --hf_out=DIR [--params_out=DIR] [--hf_dtype=bfloat16]`.

--config is the recipe the run was trained with (it names the base model: architecture, tokenizer, processor).
--hf_out writes a Hugging Face safetensors directory (transformers' from_pretrained loads it, logits equal to the
JAX policy); --params_out writes a standalone Orbax params checkpoint (launch/eval.py --policy=DIR reads it).
"""

import json
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # configs/ import configs.common
    sys.path.insert(0, _REPO)

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "recipe the run was trained with, e.g. configs/constT10.py:toy")
_POLICY = flags.DEFINE_string("policy", None, "training workdir, its checkpoints/ dir, or a params checkpoint")
_STEP = flags.DEFINE_integer("step", None, "training step to export (default: the latest)")
_HF_OUT = flags.DEFINE_string("hf_out", None, "new directory for the HF safetensors export")
_PARAMS_OUT = flags.DEFINE_string("params_out", None, "new directory for the standalone Orbax params checkpoint")
_HF_DTYPE = flags.DEFINE_string("hf_dtype", None, "storage dtype of the safetensors (default: the params' dtype)")


def main(argv):
    del argv
    if _CONFIG.value is None or not _POLICY.value:
        raise app.UsageError("--config and --policy are required, e.g. --config=configs/constT10.py:toy "
                             "--policy=/tmp/run --hf_out=/tmp/run_hf")
    from jaxwebrl.eval.export import export  # imports JAX; only after the flags are known to be good

    try:
        info = export(_CONFIG.value, _POLICY.value, step=_STEP.value, hf_out=_HF_OUT.value,
                      params_out=_PARAMS_OUT.value, hf_dtype=_HF_DTYPE.value)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        raise SystemExit(f"export error: {err}") from None
    print(json.dumps(info, sort_keys=True))


if __name__ == "__main__":
    app.run(main)
