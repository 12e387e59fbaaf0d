r"""Train a web agent: `python launch/train.py --config=configs/constT10.py[:variant] --workdir=DIR [--config.a.b=v]`.

Starts the policy server, the rollout worker pool and the trainer, supervises them, and stops everything on
`train.max_steps`, Ctrl-C or a fatal error. Rerunning with the same --workdir resumes from its last checkpoint.
Config problems (unknown key, bad value, missing checkpoint directory, missing Chromium) fail here, in one line,
before any browser or device work starts. Problems of the machine or the workdir at run time (disk full, read-only
or locked workdir, unreadable checkpoints, a buffer that cannot be written, rollout workers that stopped for good)
are one line too, exit code 1.

WORKDIR/config.json records the resolved config; resuming with different overrides is refused in one line naming
the keys (old -> new) unless --allow_config_change (recorded in WORKDIR/config_changes.jsonl). train.max_steps,
metrics.*, checkpoint.keep* and rollout.num_workers may change freely. --dry_run checks the config and prints one
line saying what would run; --print_config prints the resolved config (--print_config_help: every field as
`key = value  # help`). stderr gets one line per train step.
"""

from absl import app, flags

from jaxwebrl import cli

_WORKDIR = cli.define_workdir_flag("run directory: metrics.jsonl, checkpoints/, buffer/ (reused to resume)")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "validate the config, print one line saying what would run, exit "
                             "(nothing compiled, no browser, no file written)")
_ALLOW_CHANGE = flags.DEFINE_bool("allow_config_change", False, "resume even though the config differs from "
                                  "WORKDIR/config.json (the change is recorded)")


def main(argv) -> int:
    del argv
    if not _WORKDIR.value and not cli.printing_config():   # printing the config needs no workdir
        cli.exit_with("config error: --workdir is required, e.g. --workdir=/tmp/run1 (reuse it to resume)")
    config = cli.validated_config(_WORKDIR.value)
    if _DRY_RUN.value:
        from jaxwebrl.train.dry_run import plan  # deferred (heavy): the policy's shapes need JAX

        with cli.run_errors(_WORKDIR.value):
            print(plan(config, _WORKDIR.value, allow_config_change=_ALLOW_CHANGE.value))
        return 0
    from jaxwebrl.eval.probe import SuccessProbe  # deferred, as the supervisor: JAX starts once the config is good
    from jaxwebrl.train.supervisor import run  # deferred: JAX and the trainer start once the config is known good

    with cli.run_errors(_WORKDIR.value):
        return run(config, _WORKDIR.value, allow_config_change=_ALLOW_CHANGE.value, greedy_probe=SuccessProbe)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("config error"))
