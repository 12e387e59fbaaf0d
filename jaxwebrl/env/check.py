"""Doctor: `python -m jaxwebrl.env.check` starts Chromium, checks that the navigation allowlist holds (a loopback
task page whose images, WebSockets, WebRTC and the agent's navigate try to leave it), lets each task family's
scripted oracle play its specs (every family's `doctor_specs` by default: MiniWoB++ tasks with an oracle, the chain
specs, the toy, an extension's family), and prints one JSON object (versions, sandbox state, allowlist result,
success rate per spec, timings per reset/screenshot/action). Exits 1 when the browser cannot start, the allowlist
leaks, or the overall success rate is below --threshold. With `--judge.*` (a run's `env.judge` settings) it also
checks that judge: it answers a fixed probe within its timeout (`judge_probe.py`: latency, verdict, and on failure
the cause and one line naming the fix, also on stderr); `--judge-only` skips the browser and the tasks. The judge
on a run's own engine is probed through the running run (`python3 -m jaxwebrl.rollout.engine_judge --run=WORKDIR`,
the same report); `--judge.backend=engine` here fails with that command as its fix.

    python -m jaxwebrl.env.check                          # every family's specs, 3 episodes each
    python -m jaxwebrl.env.check --tasks miniwob/click-test,miniwob/login-user --episodes 5
    python -m jaxwebrl.env.check --tasks "chain/hard-recall?trap=1,miniwob/choose-date" --episodes 20
    python -m jaxwebrl.env.check --judge-only --judge.backend=chat --judge.url=http://127.0.0.1:8000/v1 \
        --judge.model=judge [--judge.api_key_env=JUDGE_API_KEY --judge.timeout_s=30]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from jaxwebrl.env.agent.actions import Action, format_action
from jaxwebrl.env.base import EnvFailure
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig
from jaxwebrl.env.browser.probes import UdpProbe, WebSocketProbe, serve_directory
from jaxwebrl.env.registry import doctor_specs, make_env, shares_browser, task_oracle
from jaxwebrl.env.tasks.episode import run_episode
from jaxwebrl.env.tasks.miniwob.miniwob import VIEWPORT
from jaxwebrl.env.tasks.webgym.judge import add_judge_flags, judge_flags
from jaxwebrl.env.tasks.webgym.judge_probe import check_judge
from jaxwebrl.env.tasks.webtask.task_spec import WebTaskSpec
from jaxwebrl.env.tasks.webtask.webtask import WebTaskEnv


def _stats_ms(seconds: list[float]) -> dict:
    if not seconds:
        return {"count": 0}
    ms = np.asarray(seconds) * 1e3
    return {"count": int(ms.size), "mean": round(float(ms.mean()), 2), "p50": round(float(np.percentile(ms, 50)), 2),
            "p90": round(float(np.percentile(ms, 90)), 2), "max": round(float(ms.max()), 2)}


PROBE_PAGE = """<!doctype html><title>ok</title>
<img src="OUTSIDE/pixel.png"><img src="OUTSIDE/x.example.com/pixel.png">
<script>
window.probe = {log: []};
function socket(url, tag) {
  try {
    const s = new WebSocket(url);
    s.onopen = () => { probe.log.push(tag + " open"); s.send("sent by the page"); };
    s.onmessage = e => probe.log.push(tag + " message");
    s.onclose = e => probe.log.push(tag + " closed");
  } catch (e) { probe.log.push(tag + " closed"); }
}
socket("WS_OUTSIDE/exfil", "outside");
socket("WS_ALLOWED/ok", "allowed");
try {
  const pc = new RTCPeerConnection({iceServers: [{urls: "stun:127.0.0.1:UDP_PORT"},
    {urls: "turn:127.0.0.1:TCP_PORT?transport=tcp", username: "u", credential: "p"}]});
  pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === "complete") probe.log.push("rtc done"); };
  pc.createDataChannel("exfil");
  pc.createOffer().then(o => pc.setLocalDescription(o)).catch(e => probe.log.push("rtc done"));
} catch (e) { probe.log.push("rtc done"); }
try { new WebTransport("https://127.0.0.1:UDP_PORT/exfil").ready.catch(() => {}); } catch (e) {}
</script>"""


def allowlist_check(browser, wait_s: float = 15.0) -> dict:
    """Serve a task page and an 'outside' site on loopback and try every way out: an image from outside, one
    whose path fakes an allowed host (allowlist "http://*.example.com/*"), the agent's navigate to both, a
    WebSocket to an outside port (next to an allowed one, which must work), WebRTC with a STUN server on a
    UDP port (and TURN over TCP) and WebTransport. Enforced when the page works, every attempt was refused
    and no outside socket saw a packet."""
    with tempfile.TemporaryDirectory() as task_dir, tempfile.TemporaryDirectory() as outside_dir:
        outside, outside_url, outside_seen = serve_directory(outside_dir)
        ws_outside, ws_allowed, udp = WebSocketProbe(), WebSocketProbe(), UdpProbe()
        page = (PROBE_PAGE.replace("OUTSIDE", outside_url).replace("WS_OUTSIDE", ws_outside.url)
                .replace("WS_ALLOWED", ws_allowed.url).replace("UDP_PORT", str(udp.port))
                .replace("TCP_PORT", str(ws_outside.port)))
        with open(os.path.join(task_dir, "index.html"), "w") as f:
            f.write(page)
        site, site_url, _ = serve_directory(task_dir)
        try:
            width, height = browser.config.viewport
            env = WebTaskEnv(WebTaskSpec.from_dict({
                "task_id": "doctor/allowlist", "start_url": f"{site_url}/index.html", "goal": "stay", "max_steps": 3,
                "evaluator": {"type": "js", "expression": "document.title === 'ok'", "when": "answer"},
                "viewport": [width, height], "allowlist": [f"{site_url}/*", "http://*.example.com/*", f"{ws_allowed.url}/ok"]}), browser=browser)
            env.reset(0)
            log = _probe_log(browser, wait_s)
            refused = [env.step(format_action(Action("navigate", text=f"{outside_url}{path}")))
                       for path in ("/evil.html", "/x.example.com/evil.html")]
            guard = browser.request_guard
            blocked = set(guard.blocked) if guard is not None else set()
            result = {"page_works": env.evaluate(None) == 1.0 and not refused[-1].done,
                      "navigate_refused": all(bool(r.info["action_error"]) for r in refused),
                      "subresource_blocked": {f"{outside_url}/pixel.png", f"{outside_url}/x.example.com/pixel.png"}
                      <= blocked,
                      "outside_requests": len(outside_seen),
                      "websocket_allowed_works": "allowed message" in log and ws_allowed.messages == ["sent by the page"],
                      "websocket_outside_connections": ws_outside.connections,
                      "webrtc_ran": "rtc done" in log,
                      "udp_packets": udp.packets}
        finally:
            for server in (site, outside):
                server.shutdown()
                server.server_close()
            for probe in (ws_outside, ws_allowed, udp):
                probe.close()
    result["enforced"] = (result["page_works"] and result["navigate_refused"] and result["subresource_blocked"]
                          and result["outside_requests"] == 0 and result["websocket_allowed_works"]
                          and result["websocket_outside_connections"] == 0 and result["webrtc_ran"]
                          and result["udp_packets"] == 0)
    return result


def _probe_log(browser, wait_s: float) -> list[str]:
    """The probe page's event log once both sockets settled and WebRTC finished gathering (or `wait_s` passed)."""
    deadline = time.monotonic() + wait_s
    while True:
        log = browser.run_js("return window.probe ? window.probe.log : [];") or []
        outside_done = "outside closed" in log or "outside message" in log  # refused, or (a leak) answered
        settled = "allowed message" in log and outside_done and "rtc done" in log
        if settled or time.monotonic() > deadline:
            time.sleep(0.2)  # packets already on their way still reach the probes
            return browser.run_js("return window.probe ? window.probe.log : [];") or []
        time.sleep(0.05)


def run_check(tasks: list[str], episodes: int, screenshot_size: tuple[int, int] | None) -> dict:
    """Play `episodes` oracle episodes of each spec (in one shared browser where its family shares one); returns
    the report dict."""
    report: dict = {"ok": False, "tasks": {}, "errors": []}
    t0 = time.perf_counter()
    try:
        browser = Browser(BrowserConfig(viewport=VIEWPORT))
    except (FileNotFoundError, EnvFailure, RuntimeError) as exc:
        report["errors"].append(f"browser did not start: {exc}")
        return report
    report["startup_s"] = round(time.perf_counter() - t0, 3)
    caps = browser.driver.capabilities
    report.update(chromium=caps.get("browserVersion"),
                  chromedriver=str(caps.get("chrome", {}).get("chromedriverVersion", "")).split(" ")[0],
                  browser_user=browser.config.run_as_user if os.geteuid() == 0 else "(this user)",
                  sandboxed=browser.sandboxed, sandbox_note=browser.sandbox_note,
                  request_guard=browser.request_guard is not None and browser.request_guard.alive)
    timings: dict[str, list[float]] = {"reset": [], "screenshot": [], "action": []}
    solved = total = 0
    try:
        try:
            report["allowlist"] = allowlist_check(browser)
            if not report["allowlist"]["enforced"]:
                report["errors"].append(f"navigation allowlist not enforced: {report['allowlist']}")
        except Exception as exc:  # noqa: BLE001 - reported, and the task checks still run
            report["errors"].append(f"allowlist check failed: {type(exc).__name__}: {exc}")
            if not browser.alive:
                browser.restart()
        for task in tasks:
            shared = {"browser": browser} if shares_browser(task) else {}
            size = {"screenshot_size": screenshot_size} if screenshot_size else {}   # else each env's own
            env, oracle = make_env(task, **size, **shared), task_oracle(task)
            results = []
            for seed in range(episodes):
                try:
                    results.append(run_episode(env, seed, oracle))
                except Exception as exc:  # noqa: BLE001 - the doctor reports every failure and goes on
                    report["errors"].append(f"{task} seed {seed}: {type(exc).__name__}: {exc}")
                    results.append({"success": False, "steps": 0})
                    if not browser.alive:
                        browser.restart()
            env_timings = getattr(env, "timings", {})   # a browser env's (a browser-free env has none)
            for key in timings:
                timings[key].extend(env_timings.get(key, ()))
            if not shared:
                env.close()
            wins = sum(r["success"] for r in results)
            solved, total = solved + wins, total + len(results)
            report["tasks"][task] = {"success_rate": round(wins / len(results), 3), "episodes": len(results),
                                     "mean_steps": round(float(np.mean([r["steps"] for r in results])), 2)}
    finally:
        browser.close()
    report["success_rate"] = round(solved / max(total, 1), 3)
    report["timings_ms"] = {key: _stats_ms(values) for key, values in timings.items()}
    report["total_s"] = round(time.perf_counter() - t0, 2)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxwebrl.env.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="", help="comma-separated env specs with an oracle (default: every "
                                                    "task family's doctor specs)")
    parser.add_argument("--episodes", type=int, default=3, help="episodes (seeds 0..N-1) per task")
    parser.add_argument("--threshold", type=float, default=0.9, help="minimum overall success rate")
    parser.add_argument("--screenshot-size", default="", help="resize screenshots to WxH, e.g. 320x420")
    add_judge_flags(parser, "the judge to check")
    parser.add_argument("--judge-only", action="store_true", help="check the judge alone (no browser, no tasks)")
    args = parser.parse_args(argv)
    judge = judge_flags(args)
    if (judge or args.judge_only) and "backend" not in judge:
        parser.error("the judge check needs --judge.backend (chat: with --judge.url and --judge.model)")
    if args.judge_only:
        return _report(_judge_report({"errors": []}, judge), ok=True)

    tasks = [t for t in args.tasks.split(",") if t] or doctor_specs()
    for task in tasks:
        try:
            task_oracle(task)
        except ValueError as err:
            parser.error(str(err))
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    size = None
    if args.screenshot_size:
        try:
            width, height = (int(v) for v in args.screenshot_size.lower().split("x"))
            size = (width, height)
        except ValueError:
            parser.error(f"--screenshot-size must look like 320x420, got {args.screenshot_size!r}")

    report = run_check(tasks, args.episodes, size)
    report["threshold"] = args.threshold
    if judge:
        _judge_report(report, judge)
    return _report(report, ok=report.get("success_rate", 0.0) >= args.threshold)


def _judge_report(report: dict, settings: dict) -> dict:
    """`report` with the judge check under "judge", and its one-line failure in "errors" and on stderr."""
    report["judge"] = check_judge(settings)
    if not report["judge"]["ok"]:
        cause, fix = report["judge"]["cause"], report["judge"]["fix"]
        line = f"judge check failed: {cause}" + ("" if cause.endswith(fix) else f": {fix}")   # a fix said once
        report["errors"].append(line)
        print(line, file=sys.stderr)
    return report


def _report(report: dict, ok: bool) -> int:
    """Print `report` with its verdict (no errors, and `ok`) and return the exit code."""
    report["ok"] = not report["errors"] and ok
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
