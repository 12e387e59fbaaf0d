"""Headless Chromium under Selenium, hardened for untrusted pages and driven through CDP where it is faster.

One `Browser` is one Chromium with a fresh profile in its own temporary directory. Screenshots use CDP
`Page.captureScreenshot` (clipped, no WebDriver round trip for the element), input uses CDP
`Input.dispatchMouseEvent` / `Input.insertText` / `Input.dispatchKeyEvent`, and the viewport is pinned with
`Emulation.setDeviceMetricsOverride` so 0..1000 action coordinates always land inside it.

Security (see `BrowserConfig`):
- closed network flags (no background networking, component update, sync, first-run, extensions),
  downloads denied, a fresh profile per browser, deleted on close;
- a navigation allowlist (`UrlAllowlist`): `navigate` outside it is refused before any request; every request
  of every tab, popup, iframe and worker (navigation or subresource, http(s) or file://) outside it fails in
  the browser (CDP Fetch, `RequestGuard`); every TCP connection Chromium opens (WebSockets and WebRTC's TCP
  included) goes through a local SOCKS5 proxy that lets out only allowed destinations (`EgressProxy`), and
  WebRTC may use proxied connections only, so it sends no UDP; a page that still ends up outside the allowlist
  (an error page for a blocked link) is replaced by the last allowed page after each action
  (`info["navigation_blocked"]`); agents see one tab: popups are closed, and an allowed one is loaded in the
  task's tab;
- when this process is root, Chromium runs as an unprivileged user (`nobody`) with its own sandbox on; task
  files that user cannot read are copied into the browser's private directory (so file:// reaches only them);
  if the sandbox cannot start on this machine, it falls back to --no-sandbox and logs why.

Every WebDriver/CDP failure surfaces as `BrowserCrashed` or `EnvTimeout` (both `EnvFailure`); after one, the
browser is marked broken and `restart()` (or the env's next reset) starts a fresh one.
"""

from __future__ import annotations

import base64
import ctypes
import dataclasses
import io
import logging
import os
import pwd
import shutil
import signal
import stat
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxwebrl.env.actions import Action, to_viewport
from jaxwebrl.env.allowlist import ALWAYS_ALLOWED_URLS, UrlAllowlist, blocked_message
from jaxwebrl.env.base import BrowserCrashed, EnvFailure, EnvTimeout
from jaxwebrl.env.egress_proxy import EgressProxy
from jaxwebrl.env.keys import key_events
from jaxwebrl.env.request_guard import RequestGuard

log = logging.getLogger(__name__)

INSTALL_HINT = "apt-get install -y chromium chromium-driver"
# + owner pid + "-" + random: one private temp dir per browser (WorkerPool deletes those of dead owners)
PROFILE_DIR_PREFIX = "jaxwebrl-chromium-"
# After an input action: two animation frames (wheel scrolls and layout land), at most 150 ms where frames stall.
SETTLE_JS = "new Promise(r => { requestAnimationFrame(() => requestAnimationFrame(r)); setTimeout(r, 150); })"
POPUP_URL_WAIT_S = 3.0  # a new tab reports about:blank until its navigation commits (seconds on a loaded machine)
CLOSED_NETWORK_FLAGS = (
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
    "--metrics-recording-only",
    "--password-store=basic",
    "--use-mock-keychain",
)
# WebRTC may use proxied connections only; the egress proxy is SOCKS5 (TCP), so WebRTC sends no UDP at all.
# (Chromium 156 ignores --force-webrtc-ip-handling-policy; the pref holds.) No DNS prefetch or preconnect.
CLOSED_NETWORK_PREFS = {
    "webrtc": {"ip_handling_policy": "disable_non_proxied_udp", "multiple_routes_enabled": False,
               "nonproxied_udp_enabled": False},
    "net": {"network_prediction_options": 2},
}
RENDERING_FLAGS = ("--disable-gpu", "--hide-scrollbars", "--mute-audio", "--force-device-scale-factor=1",
                   "--disable-dev-shm-usage")


class NavigationBlocked(ValueError):
    """A navigation target is outside the task's allowlist (a task-level refusal, not an EnvFailure)."""


@dataclasses.dataclass(frozen=True)
class BrowserConfig:
    """How to launch Chromium.

    viewport: (width, height) CSS pixels of the page area, pinned by CDP.
    run_as_user: user Chromium runs as when this process is root ("nobody" by default; None keeps root,
        which forces --no-sandbox). Ignored when not root.
    sandbox: "auto" (on, with a logged fallback to off if it cannot start), True (on or fail), False (off).
    command_timeout_s: a WebDriver/CDP call slower than this raises EnvTimeout (a hung browser).
    page_load_timeout_s: limit for `navigate`.
    guard_requests: enforce the allowlist on every request too (CDP Fetch, see request_guard.py), not only
        on the page URL after each action.
    egress_proxy: send every TCP connection of the browser (WebSockets, WebRTC over TCP) through the
        allowlist-checking SOCKS5 proxy (egress_proxy.py). Without it a page's WebSocket leaves the allowlist.
    unthrottled_frames: lift the 60 fps frame cap (--disable-frame-rate-limit): screenshots of static pages such as
        MiniWoB++ come about twice as fast, but a page with a running animation then spins a whole CPU core.
    kill_with_parent: chromedriver and Chromium get SIGKILL when the thread that created the browser exits
        (Linux PR_SET_PDEATHSIG follows the creating thread, not the process), so a crashed worker leaves no
        orphan browser. Create the browser on a thread that lives as long as the browser should.
    """

    viewport: tuple[int, int] = (1024, 768)
    chromium_path: str = "/usr/bin/chromium"
    chromedriver_path: str = "/usr/bin/chromedriver"
    headless: bool = True
    run_as_user: str | None = "nobody"
    sandbox: Any = "auto"
    command_timeout_s: float = 30.0
    page_load_timeout_s: float = 30.0
    kill_with_parent: bool = True
    guard_requests: bool = True
    egress_proxy: bool = True
    unthrottled_frames: bool = False
    extra_flags: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------------------
def check_installation(config: BrowserConfig) -> None:
    """Raise a FileNotFoundError that says how to install Chromium/chromedriver when either is missing."""
    for what, path in (("Chromium", config.chromium_path), ("chromedriver", config.chromedriver_path)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"{what} not found at {path}: {INSTALL_HINT} (or set BrowserConfig paths)")


def _set_parent_death_signal() -> None:
    """Runs in the chromedriver child between fork and exec: die with the parent."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _readable_by_others(path: str) -> bool:
    path = os.path.abspath(path)
    mode = os.stat(path).st_mode
    if not mode & stat.S_IROTH:
        return False
    parent = os.path.dirname(path)
    while True:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


class Browser:
    """One sandboxed headless Chromium. Not thread-safe: one caller at a time.

    All coordinates are CSS pixels of the pinned viewport unless a method says otherwise.
    """

    def __init__(self, config: BrowserConfig = BrowserConfig()):
        check_installation(config)
        self.config = config
        self.allowlist = UrlAllowlist()
        self.driver = None
        self.broken = False
        self.sandboxed = False
        self.sandbox_note = ""
        self.request_guard: RequestGuard | None = None
        self.egress_proxy: EgressProxy | None = None
        self.busy_s = 0.0  # seconds inside WebDriver/CDP calls and `wait` actions (browser vs caller time)
        self._service = None
        self._tmpdir: str | None = None
        self._uid: int | None = None
        self._gid: int | None = None
        self._exposed: dict[str, str] = {}
        self._last_allowed_url = "about:blank"
        self.start()

    # ---- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Launch chromedriver + Chromium with a fresh profile (the sandbox decision is made here)."""
        from selenium import webdriver  # selenium only where a browser is really used

        self._uid, self._gid = self._target_user()
        self._tmpdir = tempfile.mkdtemp(prefix=f"{PROFILE_DIR_PREFIX}{os.getpid()}-")  # owner pid: see sweep
        if self.config.egress_proxy:
            self.egress_proxy = EgressProxy(lambda: self.allowlist).start()
        os.chmod(self._tmpdir, 0o711)
        self._exposed = {}
        profile, home = os.path.join(self._tmpdir, "profile"), os.path.join(self._tmpdir, "home")
        for path in (profile, home):
            os.mkdir(path, 0o700)
            if self._uid is not None:
                os.chown(path, self._uid, self._gid)

        sandbox_wanted = self.config.sandbox
        if os.geteuid() == 0 and self._uid is None:
            if sandbox_wanted is True:
                raise RuntimeError("sandbox=True needs a non-root browser user: set BrowserConfig.run_as_user")
            sandbox_wanted = False
            self.sandbox_note = "running as root without run_as_user: Chromium refuses its sandbox as root"
        attempts = [True, False] if sandbox_wanted == "auto" else [bool(sandbox_wanted)]
        errors = []
        self.broken = False
        for sandbox in attempts:
            try:
                self._launch(webdriver, profile, home, sandbox)
                self.sandboxed = sandbox
                break
            except Exception as exc:  # noqa: BLE001 - we retry once without the sandbox, then re-raise
                errors.append(f"sandbox={'on' if sandbox else 'off'}: {str(exc).splitlines()[0][:300]}")
                self._kill_processes()
                self.driver, self.broken = None, False
                shutil.rmtree(profile, ignore_errors=True)
                os.mkdir(profile, 0o700)
                if self._uid is not None:
                    os.chown(profile, self._uid, self._gid)
        else:
            self.close()
            raise BrowserCrashed("Chromium did not start (" + "; ".join(errors) + f"). Is it installed? {INSTALL_HINT}")
        if not self.sandboxed:
            self.sandbox_note = self.sandbox_note or ("sandbox could not start: " + "; ".join(errors))
            if errors or self.config.sandbox == "auto":
                log.warning("Chromium runs with --no-sandbox: %s", self.sandbox_note)
        self.broken = False
        self._last_allowed_url = "about:blank"

    def _target_user(self) -> tuple[int | None, int | None]:
        if os.geteuid() != 0 or not self.config.run_as_user:
            return None, None
        try:
            entry = pwd.getpwnam(self.config.run_as_user)
        except KeyError:
            raise RuntimeError(
                f"browser user {self.config.run_as_user!r} does not exist: create it or set BrowserConfig.run_as_user"
            ) from None
        return entry.pw_uid, entry.pw_gid

    def _launch(self, webdriver, profile: str, home: str, sandbox: bool) -> None:
        from selenium.webdriver.chrome.service import Service

        width, height = self.config.viewport
        options = webdriver.ChromeOptions()
        options.binary_location = self._chromium_launcher()
        options.page_load_strategy = "normal"
        flags = [*CLOSED_NETWORK_FLAGS, *RENDERING_FLAGS, f"--user-data-dir={profile}",
                 f"--window-size={width},{height}", *self.config.extra_flags]
        if self.config.headless:
            flags.append("--headless=new")
        if not sandbox:
            flags.append("--no-sandbox")
        if self.config.unthrottled_frames:
            flags.append("--disable-frame-rate-limit")
        if self.egress_proxy is not None:  # loopback too: <-loopback> drops Chromium's implicit bypass of it
            flags += [f"--proxy-server={self.egress_proxy.address}", "--proxy-bypass-list=<-loopback>",
                      "--disable-quic"]
        for flag in flags:
            options.add_argument(flag)
        options.add_experimental_option("prefs", {
            **CLOSED_NETWORK_PREFS,
            "download_restrictions": 3,  # block all downloads
            "download.prompt_for_download": False,
            "download.default_directory": os.path.join(self._tmpdir, "no-downloads"),
            "profile.default_content_setting_values.notifications": 2,
            "profile.default_content_setting_values.geolocation": 2,
        })
        popen_kw: dict[str, Any] = {"start_new_session": True}
        if self.config.kill_with_parent:
            popen_kw["preexec_fn"] = _set_parent_death_signal
        if self._uid is not None:
            popen_kw.update(user=self._uid, group=self._gid, extra_groups=[])
        env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": home,
               "XDG_CONFIG_HOME": home, "XDG_CACHE_HOME": home}
        self._service = Service(self.config.chromedriver_path, env=env, popen_kw=popen_kw,
                                log_output=os.devnull)
        self.driver = webdriver.Chrome(options=options, service=self._service)
        self._set_command_timeout(self.config.command_timeout_s)
        self.driver.set_page_load_timeout(self.config.page_load_timeout_s)
        self.driver.set_script_timeout(self.config.command_timeout_s)
        self._cdp("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        try:
            self._cdp("Browser.setDownloadBehavior", {"behavior": "deny"})
        except EnvFailure:
            pass  # older Chromium: the download_restrictions pref still blocks downloads
        self._main_window = self.driver.current_window_handle
        self._popups_handled = 0
        if self.config.guard_requests:
            address = self.driver.capabilities["goog:chromeOptions"]["debuggerAddress"]
            self.request_guard = RequestGuard(address, lambda url: self.allowlist.allows(url))

    def _chromium_launcher(self) -> str:
        """A tiny exec wrapper so Chromium dies with chromedriver (setpriv --pdeathsig), when available."""
        setpriv = shutil.which("setpriv")
        if not (self.config.kill_with_parent and setpriv):
            return self.config.chromium_path
        path = os.path.join(self._tmpdir, "chromium-launcher.sh")
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\nexec {setpriv} --pdeathsig KILL {self.config.chromium_path} "$@"\n')
        os.chmod(path, 0o755)
        return path

    def _set_command_timeout(self, seconds: float) -> None:
        executor = self.driver.command_executor
        config = getattr(executor, "client_config", None) or getattr(executor, "_client_config", None)
        if config is not None:
            config.timeout = seconds

    @property
    def alive(self) -> bool:
        return self.driver is not None and not self.broken

    def restart(self) -> None:
        """Kill whatever is left of this browser and start a fresh one (new profile)."""
        allowlist = self.allowlist
        self.close()
        self.start()
        self.allowlist = allowlist

    def close(self) -> None:
        """Quit Chromium, kill any leftover process, delete the profile. Never raises."""
        driver, self.driver = self.driver, None
        guard, self.request_guard = self.request_guard, None
        proxy, self.egress_proxy = self.egress_proxy, None
        if guard is not None:
            guard.close()
        if proxy is not None:
            proxy.close()
        if driver is not None and not self.broken:
            try:
                self._set_command_timeout_on(driver, 5.0)
                driver.quit()
            except Exception:  # noqa: BLE001 - close must always succeed; we kill below anyway
                pass
        self._kill_processes()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    @staticmethod
    def _set_command_timeout_on(driver, seconds):
        config = getattr(driver.command_executor, "_client_config", None)
        if config is not None:
            config.timeout = seconds

    def process_ids(self) -> list[int]:
        """chromedriver and every Chromium process under it (for crash tests and leak checks)."""
        import psutil

        proc = getattr(self._service, "process", None)
        if proc is None:
            return []
        try:
            root = psutil.Process(proc.pid)
            return [root.pid] + [p.pid for p in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def chromium_pid(self) -> int | None:
        """The main Chromium browser process (child of chromedriver), or None."""
        import psutil

        proc = getattr(self._service, "process", None)
        try:
            children = psutil.Process(proc.pid).children() if proc else []
        except psutil.NoSuchProcess:
            return None
        return children[0].pid if children else None

    def _kill_processes(self) -> None:
        service, self._service = self._service, None
        proc = getattr(service, "process", None)
        if proc is None:
            return
        pids = []
        try:
            import psutil

            pids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        except Exception:  # noqa: BLE001 - already gone
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # chromedriver leads its own session (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- guarded calls ----------------------------------------------------------------------------------
    def _guard(self, what: str, fn: Callable, *args, **kwargs):
        """Run a WebDriver call; map every driver/browser failure to EnvFailure and mark the browser broken."""
        if self.driver is None or self.broken:
            raise BrowserCrashed(f"browser is not running (call restart()) before {what}")
        from selenium.common.exceptions import TimeoutException, WebDriverException

        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except NavigationBlocked:
            raise
        except TimeoutException as exc:
            self.broken = True
            raise EnvTimeout(f"{what}: browser timed out ({_first_line(exc)})") from exc
        except WebDriverException as exc:
            self.broken = True
            raise BrowserCrashed(f"{what}: {_first_line(exc)}") from exc
        except Exception as exc:  # urllib3/socket errors: chromedriver is gone or hung
            self.broken = True
            text = f"{type(exc).__name__}: {_first_line(exc)}"
            if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
                raise EnvTimeout(f"{what}: chromedriver did not answer ({text})") from exc
            raise BrowserCrashed(f"{what}: chromedriver unreachable ({text})") from exc
        finally:
            self.busy_s += time.perf_counter() - t0

    def _cdp(self, cmd: str, params: dict | None = None) -> dict:
        return self._guard(cmd, self.driver.execute_cdp_cmd, cmd, params or {})

    def run_js(self, script: str, *args) -> Any:
        """Run JavaScript in the page (`return ...` to get a value)."""
        return self._guard("execute_script", self.driver.execute_script, script, *args)

    # ---- files and navigation -------------------------------------------------------------------------
    def expose_directory(self, directory: str) -> str:
        """A path to `directory` that the browser user can read: itself, or a private read-only copy."""
        directory = os.path.abspath(directory)
        if self._uid is None or _readable_by_others(directory):
            return directory
        if directory not in self._exposed:
            target = os.path.join(self._tmpdir, "files", os.path.basename(directory))
            shutil.copytree(directory, target)
            for root, dirs, files in os.walk(os.path.join(self._tmpdir, "files")):
                os.chmod(root, 0o755)
                for name in files:
                    os.chmod(os.path.join(root, name), 0o644)
            self._exposed[directory] = target
        return self._exposed[directory]

    def set_allowlist(self, allowlist: UrlAllowlist) -> None:
        self.allowlist = allowlist

    def navigate(self, url: str) -> None:
        """Load `url` and wait for it; NavigationBlocked if it is outside the allowlist."""
        if not self.allowlist.allows(url):
            raise NavigationBlocked(f"navigation to {url!r} is outside the task allowlist {list(self.allowlist.patterns)}")
        self._guard("navigate", self.driver.get, url)
        self.enforce_allowlist()

    def current_url(self) -> str:
        return self._guard("current_url", lambda: self.driver.current_url)

    def enforce_allowlist(self, url: str | None = None) -> str | None:
        """If the page (at `url`, read from the browser when None) left the allowlist, return to the last allowed
        page; returns the refused URL or None."""
        url = self.current_url() if url is None else url
        if self.allowlist.allows(url):
            self._last_allowed_url = url
            return None
        log.info("blocked navigation to %s; returning to %s", url, self._last_allowed_url)
        self._guard("navigate", self.driver.get, self._last_allowed_url)
        return url

    def close_popups(self) -> list[str]:
        """Close every tab but the task's own (agents see one tab); returns the closed tabs' URLs.

        With the request guard this costs nothing unless it saw a new tab; without it, one WebDriver call.
        """
        guard = self.request_guard
        if guard is not None and guard.popups_opened == self._popups_handled:
            return []
        if guard is not None:
            self._popups_handled = guard.popups_opened
        urls = []
        for handle in self._guard("window_handles", lambda: self.driver.window_handles):
            if handle != self._main_window:
                self._guard("switch_to.window", self.driver.switch_to.window, handle)
                urls.append(self._committed_url())
                self._guard("close", self.driver.close)
        if urls:
            self._guard("switch_to.window", self.driver.switch_to.window, self._main_window)
        return urls

    def _settle(self) -> None:
        """Let the page apply an input action before anything reads its state: CDP input calls return once the
        event is dispatched, while scrolling, new tabs and layout complete on later frames."""
        self._cdp("Runtime.evaluate", {"expression": SETTLE_JS, "awaitPromise": True})

    def _committed_url(self) -> str:
        """The current tab's URL once its first navigation has committed (bounded by POPUP_URL_WAIT_S): a popup
        read while still about:blank would be closed without being followed."""
        url, deadline = self.current_url(), time.monotonic() + POPUP_URL_WAIT_S
        while url in ("", "about:blank") and time.monotonic() < deadline:
            time.sleep(0.05)
            url = self.current_url()
        return url

    def go_back(self) -> None:
        self._guard("back", self.driver.back)

    # ---- pixels -----------------------------------------------------------------------------------------
    def screenshot(self, clip: tuple[int, int, int, int] | None = None,
                   size: tuple[int, int] | None = None) -> np.ndarray:
        """uint8 [H, W, 3] RGB of the viewport, or of clip=(x, y, width, height); resized to size=(W, H)."""
        from PIL import Image

        self.close_popups()  # a tab in front of the task's would stall the capture
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": False, "optimizeForSpeed": True}
        if clip is not None:
            x, y, w, h = clip
            params["clip"] = {"x": x, "y": y, "width": w, "height": h, "scale": 1}
        data = self._cdp("Page.captureScreenshot", params)["data"]
        image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
        if size is not None and image.size != tuple(size):
            image = image.resize(tuple(size), Image.BILINEAR)
        return np.asarray(image, dtype=np.uint8)

    # ---- input (CSS pixels) -----------------------------------------------------------------------------
    def click(self, x: float, y: float, clicks: int = 1) -> None:
        self._mouse("mouseMoved", x, y)
        for count in range(1, clicks + 1):
            self._mouse("mousePressed", x, y, button="left", clickCount=count)
            self._mouse("mouseReleased", x, y, button="left", clickCount=count)

    def _mouse(self, kind: str, x: float, y: float, **extra) -> None:
        self._cdp("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, **extra})

    def type_text(self, text: str) -> None:
        """Insert text at the focused element; "\\n" presses Enter."""
        for i, chunk in enumerate(text.split("\n")):
            if i:
                self.press_keys(("Enter",))
            if chunk:
                self._cdp("Input.insertText", {"text": chunk})

    def press_keys(self, keys: Sequence[str]) -> None:
        """Press keys together, e.g. ("ctrl", "a") or ("Enter",). ValueError names an unknown key."""
        for event in key_events(keys):
            self._cdp("Input.dispatchKeyEvent", event)

    def scroll(self, x: float, y: float, dx: float, dy: float) -> None:
        self._mouse("mouseWheel", x, y, deltaX=dx, deltaY=dy)

    # ---- agent actions ----------------------------------------------------------------------------------
    def perform(self, action: Action, area: tuple[int, int, int, int], check_url: bool = True) -> dict:
        """Execute a valid non-answer action whose 0..1000 coordinates refer to `area` = (x, y, w, h) CSS px.

        Returns info: `navigation_blocked` (refused URL or None) and `action_error` (a task-level refusal such
        as an unknown key or a navigate outside the allowlist, fed back to the agent) or None.
        check_url=False skips the page-URL check (the caller then runs `enforce_allowlist(url)` itself, e.g. with
        a URL it read in the same JavaScript call as the task state).
        """
        ax, ay, aw, ah = area

        def point() -> tuple[float, float]:
            px, py = to_viewport(action.x, action.y, aw, ah)
            return ax + px, ay + py

        error = None
        kind = action.kind
        if kind == "click":
            self.click(*point(), clicks=action.clicks)
        elif kind == "type":
            if action.has_point:
                self.click(*point())
            self.type_text(action.text or "")
        elif kind == "key":
            try:
                self.press_keys(action.keys or ())
            except ValueError as exc:
                error = str(exc)
        elif kind == "scroll":
            x, y = point() if action.has_point else (ax + aw / 2, ay + ah / 2)
            amount = float(action.amount or 0)
            dx = {"left": -amount, "right": amount}.get(action.direction, 0.0)
            dy = {"up": -amount, "down": amount}.get(action.direction, 0.0)
            self.scroll(x, y, dx, dy)
        elif kind == "wait":
            seconds = float(action.seconds or 0.0)
            time.sleep(seconds)
            self.busy_s += seconds  # the page's time, not the caller's
        elif kind == "go_back":
            self.go_back()
        elif kind == "navigate":
            try:
                self.navigate(action.text or "")
            except NavigationBlocked as exc:
                error = str(exc)
        else:
            raise ValueError(f"Browser.perform cannot execute a {kind!r} action")
        if kind in ("click", "type", "key", "scroll"):
            self._settle()
        popup = self._follow_popup()
        blocked = self.enforce_allowlist() if check_url else None
        blocked = blocked or popup
        if blocked and error is None:
            error = blocked_message(blocked)
        return {"navigation_blocked": blocked, "action_error": error}

    def _follow_popup(self) -> str | None:
        """Single-tab semantics: a page the action opened in a new tab is closed and, when the allowlist allows
        its URL, loaded in the task's tab instead. Returns a refused popup URL, or None."""
        refused = None
        for url in self.close_popups():
            if url in ALWAYS_ALLOWED_URLS or not url:
                continue
            if self.allowlist.allows(url):
                self._guard("navigate", self.driver.get, url)
                refused = None
            else:
                refused = url
        return refused


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "msg", None) or str(exc) or type(exc).__name__
    return str(text).strip().splitlines()[0][:300] if str(text).strip() else type(exc).__name__
