"""jaxwebrl.checkpoint: where policies and training state come from and go to on disk.

  layout        the Orbax layouts, in one place: a training checkpoint (`<dir>/<step>/{state, meta}`) and a
                standalone params checkpoint (`DIR/params` + `jaxwebrl_params.json`); their readers and writers
  checkpointer  Checkpointer: a run's asynchronous saves, retention, restore of the newest readable checkpoint
  policies      the recipe's policy, the warm start, and `load_policy(config, source)` (initial, a checkpoint,
                exported params, an HF directory)
  resume        `restore_or_init`: where a run's state comes from, in big_vision's numbered order

Import from the modules; importing this package imports nothing.
"""
