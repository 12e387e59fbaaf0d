"""The engine judge (`env.judge.backend="engine"`): a WebGym rubric judged by the run's own policy server, with the
same weights as the policy, greedily, its verdict decoded under the verdict grammar so that it always parses
(rollout/verdict_decoding.py); reward = every criterion met (`judge.rubric_criteria`, as for the chat judge).

    judge = EngineJudge("tcp://127.0.0.1:5555", token=TOKEN, timeout_s=60.0)    # make_judge builds it in a worker
    verdict = judge.judge(request)           # a Verdict, or a JudgeFailure naming its cause
    python3 -m jaxwebrl.rollout.engine_judge --run=WORKDIR    # the doctor's probe of a running run's engine judge

A rollout worker's judge settings get its pool spec's policy connection (`link_engine_judge`: address, token, server
key; in memory only, never written). A request carries the rubric prompt (`judge.SYSTEM`, `judge.rubric_text`) and
the pixels of the episode's last `max_screenshots` screenshots (a verdict is no episode step: the server does not
read them from the ring buffer). A timeout (`timeout_s` bounds each attempt), a lost connection, a server error or
a verdict off the schema (malformed; each retried with exponential backoff), and a refused request are a
`JudgeFailure` naming the cause; a verdict that flags a blocked page is a `BlockedPage`: env failures, the episode
dropped and counted, never scored 0. Each judging thread has its own connection (a transport client carries one
request at a time), so `env.judge.concurrency` verdicts are in flight at once. Importing this module registers the
backend with `make_judge`.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any, Mapping

import numpy as np

from jaxwebrl.env.tasks.webgym.judge import (ENGINE_PROBE, MAX_SCREENSHOTS, SYSTEM, AttemptFailed, JudgeRequest,
                                             MalformedVerdict, Verdict, register_judge_backend, retrying,
                                             rubric_criteria, rubric_text, screenshots_shown)
from jaxwebrl.env.tasks.webgym.judge_probe import check_judge
from jaxwebrl.errors import one_line
from jaxwebrl.rollout.client import JUDGE_OP
from jaxwebrl.rollout.published import read_published
from jaxwebrl.rollout.transport import TransportClient
from jaxwebrl.rollout.wire import TransportAuthError, TransportError, TransportRequestRefused, TransportTimeout


class EngineJudge:
    """A judge on a policy server at `address` (see the module docstring)."""

    backend = "engine"

    def __init__(self, address: str, *, token: str, server_key: str | None = None, timeout_s: float = 60.0,
                 retries: int = 2, backoff_s: float = 1.0, max_screenshots: int = MAX_SCREENSHOTS,
                 check_blocked: bool = True):
        self.address, self._token, self._server_key = address, token, server_key
        self.timeout_s, self.retries, self.backoff_s = float(timeout_s), int(retries), float(backoff_s)
        self.max_screenshots, self.check_blocked = int(max_screenshots), bool(check_blocked)
        self._local = threading.local()
        self._clients: list[TransportClient] = []
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> "EngineJudge":
        """The engine judge of a run's `env.judge` settings with the run's connection under "policy"."""
        link = settings.get("policy")
        if not link:
            raise ValueError("env.judge.backend='engine' judges on the run's own policy server, whose connection "
                             "only the run's rollout workers get (link_engine_judge); check a running run's with: "
                             f"{ENGINE_PROBE}")
        return cls(link["address"], token=link["token"], server_key=link.get("server_key"),
                   timeout_s=float(settings.get("timeout_s", 60.0)), retries=int(settings.get("retries", 2)),
                   backoff_s=float(settings.get("backoff_s", 1.0)),
                   max_screenshots=int(settings.get("max_screenshots", MAX_SCREENSHOTS)),
                   check_blocked=bool(settings.get("check_blocked", True)))

    def judge(self, request: JudgeRequest) -> Verdict:
        t0 = time.perf_counter()
        shown = screenshots_shown(request, self.max_screenshots)
        raw, criteria = self._ask(judge_payload(request, shown, self.check_blocked), request)
        return Verdict(criteria, raw, self.backend, time.perf_counter() - t0, shown)

    def _client(self) -> TransportClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = TransportClient(self.address, token=self._token, timeout_s=self.timeout_s,
                                     server_key=self._server_key)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _ask(self, payload: dict, request: JudgeRequest) -> tuple[str, tuple[tuple[str, bool], ...]]:
        """The verdict's text and its criteria; retries a timeout, a lost connection, a server error and a verdict
        off the schema, not a refusal or a blocked page."""
        def attempt() -> tuple[str, tuple[tuple[str, bool], ...]]:
            try:
                reply = self._client().request(payload, timeout_s=self.timeout_s)
            except TransportTimeout as err:
                raise AttemptFailed(f"timed out (no verdict within timeout_s={self.timeout_s:g}: is the run's server "
                                    f"up?)") from err
            except (TransportAuthError, TransportRequestRefused) as err:
                raise AttemptFailed(f"refused ({one_line(err, 300)})", retry=False) from err
            except TransportError as err:
                raise AttemptFailed(f"policy server error ({one_line(err, 300)})") from err
            if not isinstance(reply.get("text"), str):
                raise AttemptFailed("malformed reply (no verdict text: is that a jaxwebrl policy server?)")
            try:
                return reply["text"], rubric_criteria(reply["text"], request, self.backend, self.check_blocked)
            except MalformedVerdict as err:
                raise AttemptFailed(str(err)) from err

        return retrying(attempt, self.retries, self.backoff_s, f"judge engine on {request.task_id}", self.address)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()


def judge_payload(request: JudgeRequest, shown: tuple[int, ...], check_blocked: bool = True) -> dict:
    """The judge request (rollout/verdict_decoding.py) of `request` showing its screenshots `shown` (indices);
    `check_blocked` False: its grammar answers blocked false."""
    content = [{"type": "text", "text": rubric_text(request, len(shown))}] + [{"type": "image"}] * len(shown)
    return {"op": JUDGE_OP, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
            "images": [np.ascontiguousarray(request.screenshots[i], np.uint8) for i in shown],
            "facts": len(request.facts), "reference": bool(request.reference_answer), "check_blocked": check_blocked}


def link_engine_judge(worker: dict, policy: Mapping[str, Any]) -> dict:
    """A pool spec's `worker` fields with the engine judge's settings given the connection of the spec's `policy`
    (unchanged for any other judge); ValueError naming the fix when there is no policy server to judge on."""
    judge = worker.get("env_options", {}).get("judge")
    if not judge or judge.get("backend") != EngineJudge.backend:
        return worker
    if policy.get("kind") != "remote":
        raise ValueError(f"env.judge.backend='engine' needs the run's policy server, but the workers' policy is "
                         f"{policy.get('kind')!r}: use another env.judge.backend")
    link = {"address": policy["address"], "token": policy["token"], "server_key": policy.get("server_key")}
    return dict(worker, env_options=dict(worker["env_options"], judge=dict(judge, policy=link)))


register_judge_backend(EngineJudge.backend, EngineJudge.from_settings)


def main(argv: list[str] | None = None) -> int:
    """The doctor's probe of a running run's engine judge: the fixed probe request (`judge_probe`) through the run's
    published policy server (WORKDIR/transport.json and transport.token); the report as JSON, exit code 1 on failure."""
    parser = argparse.ArgumentParser(prog="python3 -m jaxwebrl.rollout.engine_judge", description=main.__doc__)
    parser.add_argument("--run", required=True, help="the running training run's WORKDIR")
    parser.add_argument("--timeout_s", type=float, default=60.0, help="seconds the verdict may take")
    args = parser.parse_args(argv)
    try:
        published = read_published(args.run)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    link = {"kind": "remote", "address": published["address"], "token": published["token"],
            "server_key": published["server_key"]}
    settings = link_engine_judge({"env_options": {"judge": {"backend": EngineJudge.backend, "retries": 0,
                                                            "timeout_s": args.timeout_s}}}, link)
    report = dict(check_judge(settings["env_options"]["judge"]), address=published["address"])
    print(json.dumps(report, indent=2))
    if not report["ok"]:
        print(f"judge check failed: {report['cause']}: {report['fix']}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
