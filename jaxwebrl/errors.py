"""Errors that end a run for a reason the user or the machine caused (not a bug): str() is one line that says what
happened and how to fix it; launch/train.py prints it without a traceback and exits non-zero.

A leaf module (it imports nothing from jaxwebrl), so every layer raises the same errors: the checkpoint package
raises `CheckpointError`, the trainer `TrainingDiverged`, the run supervisor `WorkdirError`.
"""

from __future__ import annotations


class RunError(RuntimeError):
    """A run cannot start or go on; the message is one line naming the problem and the fix."""


class WorkdirError(RunError):
    """The workdir is not usable (read-only, not writable, held by another run, damaged run files)."""


class BufferInUse(RunError):
    """The run's ring buffer is held by another training run (`jaxwebrl.buffer.owner.trainer_lock`)."""


class CheckpointError(RunError):
    """No checkpoint could be restored, or one could not be written (disk full); earlier ones are intact."""


class ConfigChanged(RunError):
    """A resume whose config differs from the one the workdir was started with (WORKDIR/config.json)."""


class RolloutFailed(RunError):
    """The rollout workers or the policy server stopped for good (wrong token, bad configuration, a dead thread)."""


class CannotTrain(RunError):
    """The run can never train as configured: its first step outgrows the buffer, or every episode is cut or fails
    in the environment."""


class TrainingDiverged(RunError):
    """Train steps keep giving non-finite loss, gradients or weights from finite weights."""


def one_line(err: BaseException, limit: int = 240) -> str:
    """`Type: first line of the message`, at most `limit` characters (for messages that quote a library error)."""
    text = " ".join(str(err).split())
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
