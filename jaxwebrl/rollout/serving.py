"""The policy on the wire: a generate handler behind an authenticated `TransportServer`, as one object that a
training run or an evaluation builds, starts and stops.

    service = PolicyService.for_policy(policy, buffer, config, host="127.0.0.1", num_clients=8)
    trainer = Trainer(..., weight_sink=service.server)          # the PolicyServer: set_weights, pause, stats
    with service.start():                                       # binds; a fresh shared token
        spec = worker_spec(config, address=service.address, token=service.token, ...)
        ...
        service.raise_if_failed()                               # a dead serving thread is one line

`PolicyService(handler, ...)` serves any other handler (the scripted backend of tests and diagnostics).
`curve=True` encrypts the transport with CurveZMQ (a fresh server key pair; `server_key` is its public half).

Joining a running service from another node: `service.publish(WORKDIR, fingerprint, worker_ids)` writes the
address (a wildcard bind named by this host's name), public key and token there (`rollout/published.py`: the
fingerprint is what a joining host must agree on, `rollout.spec.run_fingerprint`; worker_ids [first, end) the ids of
the run's own workers, which a joining host's must not repeat); launch/rollout.py --workdir=WORKDIR reads them back
and refuses a host whose own fingerprint differs.
"""

from __future__ import annotations

import socket

import zmq

from jaxwebrl.rollout.continuous_server import ContinuousPolicyServer
from jaxwebrl.rollout.policy_server import PolicyServer
from jaxwebrl.rollout.published import write_published
from jaxwebrl.rollout.transport import TransportServer, new_token
from jaxwebrl.rollout.vllm_server import VllmPolicyServer

MIN_HANDLER_THREADS = 1024   # the least the transport may start; it starts one only when a request needs it


def server_class(rollout) -> type[PolicyServer]:
    """The policy server a run's `config.rollout` names: `VllmPolicyServer` when engine is 'vllm', else
    `ContinuousPolicyServer` when continuous_batching, else the static-batch `PolicyServer`."""
    if rollout.get("engine", "jax") == "vllm":
        return VllmPolicyServer
    return ContinuousPolicyServer if rollout.get("continuous_batching", False) else PolicyServer


class PolicyService:
    """`handler` behind a TransportServer with a fresh token (see the module docstring). `server` is the
    PolicyServer when built by `for_policy`, else None. A request holds its handler thread until it is answered:
    while admission control holds a new group, while an engine judge's verdict is decoded. So the transport starts
    threads as requests need them, up to 2 a client plus `verdicts_per_client` and never fewer than
    `MIN_HANDLER_THREADS`: workers that join by hand (launch/rollout.py) connect beside the run's own `num_clients`,
    and every connected worker's request must reach the batching server at once (one held by admission must never
    leave a running group's next step without a thread)."""

    def __init__(self, handler, *, host: str = "127.0.0.1", num_clients: int = 1, server: PolicyServer | None = None,
                 curve: bool = False, verdicts_per_client: int = 0):
        self.server = server
        self.token = new_token()
        public, secret = zmq.curve_keypair() if curve else (None, None)
        self.server_key: str | None = public.decode() if public is not None else None
        self.transport = TransportServer(handler, token=self.token, host=host,
                                         num_threads=max(MIN_HANDLER_THREADS,
                                                         (2 + int(verdicts_per_client)) * num_clients),
                                         curve_secret_key=secret)

    @classmethod
    def for_policy(cls, policy, buffer, config, *, host: str, num_clients: int, curve: bool = False) -> "PolicyService":
        """The run config's PolicyServer (`server_class`) for `policy`, reading screenshots from `buffer`; with
        `env.judge.concurrency` more handler threads a client when it judges too (env.judge.backend 'engine')."""
        server = server_class(config.rollout).from_config(policy, buffer, config)
        judge = config.env.get("judge")
        verdicts = judge.concurrency if judge is not None and judge.backend == "engine" else 0
        return cls(server.handle, host=host, num_clients=num_clients, server=server, curve=curve,
                   verdicts_per_client=verdicts)

    def publish(self, workdir: str, fingerprint: dict | None = None, worker_ids: range | None = None) -> str:
        """Write WORKDIR/transport.json (address, server_key, the run's `fingerprint`, the run's own `worker_ids`)
        and WORKDIR/transport.token (0600) for workers that join by hand (`read_published`); returns the published
        address (a wildcard bind names this host)."""
        address = self.address
        host = address.rpartition("//")[2].rpartition(":")[0]
        if host in ("0.0.0.0", "[::]", "*"):
            address = address.replace(host, socket.getfqdn(), 1)
        write_published(workdir, address=address, token=self.token, server_key=self.server_key,
                        fingerprint=fingerprint, worker_ids=worker_ids)
        return address

    @property
    def address(self) -> str | None:
        """The endpoint workers connect to ("tcp://HOST:PORT"), once started."""
        return self.transport.address

    def start(self) -> "PolicyService":
        self.transport.start()
        return self

    def raise_if_failed(self) -> None:
        """RuntimeError (one line) when the transport's or the policy server's thread died."""
        self.transport.raise_if_failed()
        if self.server is not None:
            self.server.raise_if_failed()

    def close(self) -> None:
        """Stop the transport, then the policy server (requests still queued fail, no handler waits forever)."""
        try:
            self.transport.close()
        finally:
            if self.server is not None:
                self.server.close()

    def __enter__(self) -> "PolicyService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
