r"""Train a web agent: `python launch/train.py --config=configs/constT10.py[:variant] --workdir=DIR [--config.a.b=v]`.

Starts the policy server, the rollout worker pool and the trainer, supervises them, and stops everything on
`train.max_steps`, Ctrl-C or a fatal error. Rerunning with the same --workdir resumes from its last checkpoint.
Config problems (unknown key, bad value, missing checkpoint directory, missing Chromium) fail here, in one line,
before any browser or device work starts. Problems of the machine or the workdir at run time (disk full, read-only
or locked workdir, unreadable checkpoints, a buffer that cannot be written) are one line too, exit code 1.
"""

from absl import app

from jaxwebrl import cli

_WORKDIR = cli.define_workdir_flag("run directory: metrics.jsonl, checkpoints/, buffer/ (reused to resume)")


def main(argv) -> int:
    del argv
    if not _WORKDIR.value:
        cli.exit_with("config error: --workdir is required, e.g. --workdir=/tmp/run1 (reuse it to resume)")
    config = cli.validated_config(_WORKDIR.value)
    from jaxwebrl.train.supervisor import run  # deferred: JAX and the trainer start once the config is known good

    with cli.run_errors(_WORKDIR.value):
        return run(config, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("config error"))
