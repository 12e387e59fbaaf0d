"""The policy on the wire: a generate handler behind an authenticated `TransportServer`, as one object that a
training run or an evaluation builds, starts and stops.

    service = PolicyService.for_policy(policy, buffer, config, host="127.0.0.1", num_clients=8)
    trainer = Trainer(..., weight_sink=service.server)          # the PolicyServer: set_weights, pause, stats
    with service.start():                                       # binds; a fresh shared token
        spec = worker_spec(config, address=service.address, token=service.token, ...)
        ...
        service.raise_if_failed()                               # a dead serving thread is one line

`PolicyService(handler, ...)` serves any other handler (the scripted backend of tests and diagnostics).
"""

from __future__ import annotations

from jaxwebrl.rollout.policy_server import PolicyServer
from jaxwebrl.rollout.transport import TransportServer, new_token


class PolicyService:
    """`handler` behind a TransportServer with a fresh token (see the module docstring). `server` is the
    PolicyServer when built by `for_policy`, else None. The transport runs 2 handler threads a client (at least 4),
    so every connected worker's request reaches the batching server at once."""

    def __init__(self, handler, *, host: str = "127.0.0.1", num_clients: int = 1, server: PolicyServer | None = None):
        self.server = server
        self.token = new_token()
        self.transport = TransportServer(handler, token=self.token, host=host, num_threads=max(4, 2 * num_clients))

    @classmethod
    def for_policy(cls, policy, buffer, config, *, host: str, num_clients: int) -> "PolicyService":
        """The run config's PolicyServer (`PolicyServer.from_config`) for `policy`, reading screenshots from `buffer`."""
        server = PolicyServer.from_config(policy, buffer, config)
        return cls(server.handle, host=host, num_clients=num_clients, server=server)

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
