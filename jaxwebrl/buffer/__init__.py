"""jaxwebrl.buffer: where episodes live between the rollout workers and the trainer (no pickle anywhere).

  ring          RingBuffer: many writers append whole episodes, readers take whole committed groups since a cursor
  screenshots   the screenshot ring: pixels written once, read by reference
  episode       the typed Episode and Step the worker builds (their constructors check the invariants)
  rows          the on-disk step-row codec: Episode <-> step rows
  batching      Episodes' steps -> padded arrays (the trainer's one conversion), screenshots gathered once
  from_config   the run's buffer (path, shapes) from a run config
  commit, control, storage, schema, integrity   the commit protocol and the on-disk format
  inspect       `python -m jaxwebrl.buffer.inspect DIR`: what a buffer holds

Import from the modules (`from jaxwebrl.buffer.ring import RingBuffer`): importing this package imports nothing,
so a module that needs only `batching` does not load TensorStore.
"""
