"""jaxwebrl.rollout: everlasting rollout workers, their supervised pool, and the policy-server transport.

    client = PolicyClient(address, token=token)                  # or InProcessClient(handler)
    worker = RolloutWorker(WorkerConfig(tasks=["toy"]), client, RingBuffer.open(path))
    worker.run()                                                 # plays and appends episodes forever
    with WorkerPool(spec, num_workers=8): ...                    # N supervised worker processes

`scripted.ScriptedBackend` is a test/diagnostic policy backend (no model); the real generation backend is
`policy_server.py`.
"""

from jaxwebrl.rollout.client import Generation, InProcessClient, PolicyClient
from jaxwebrl.rollout.pool import WorkerPool, build_worker, serve_worker
from jaxwebrl.rollout.transport import (TransportAuthError, TransportClient, TransportError, TransportServer,
                                        TransportTimeout, new_token)
from jaxwebrl.rollout.worker import EnvGivenUp, RolloutWorker, WorkerConfig, WorkerStats

__all__ = ["EnvGivenUp", "Generation", "InProcessClient", "PolicyClient", "RolloutWorker", "TransportAuthError",
           "TransportClient", "TransportError", "TransportServer", "TransportTimeout", "WorkerConfig",
           "WorkerPool", "WorkerStats", "build_worker", "new_token", "serve_worker"]
