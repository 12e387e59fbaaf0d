"""jaxwebrl.rollout: everlasting rollout workers, their supervised pools, and the policy server they talk to.

  worker         RolloutWorker: plays groups of episodes forever and appends each whole one to the ring buffer
  env_host       the one thread that calls into a worker's environments (browsers are not thread-safe)
  spec           a worker pool's JSON spec from a run config (what crosses into worker processes)
  pool           WorkerPool: N supervised worker processes; worker_process: what runs inside one
  ray_launcher   RayWorkerPool: the same spec and surface on a Ray cluster; `pool_for(config, spec)`
  client         Generation, PolicyClient (over the wire), InProcessClient
  transport      the authenticated pyzmq request/reply transport; wire: its message format
  policy_server  PolicyServer: batched, versioned generation behind the transport
  action_grammar `action_constraint`: the action grammar's token automaton (the sampler, trainer and SFT replay it)
  serving        the policy server on the transport, as one object a run or an evaluation starts and stops
  scripted       a diagnostic/test backend (scripted action text, real tokens; no model; the benchmarks use it)

    client = PolicyClient(address, token=token)                          # or InProcessClient(handler)
    worker = RolloutWorker(WorkerConfig(tasks=["toy"]), client, RingBuffer.open(path))
    worker.run()                                                          # plays and appends episodes forever

Import from the modules: importing this package imports nothing (so the trainer's update path does not load pyzmq).
"""
