"""Launching headless Chromium under chromedriver, inside its OS sandbox, and making sure it dies with its owner.

    config = BrowserConfig(viewport=(1024, 768))
    process = ChromiumProcess(config, proxy_address=None)    # fresh private profile dir; sandbox decided here
    process.driver                                            # the Selenium WebDriver
    process.close()                                           # quit, kill every process left, delete the profile

Hardening (see `BrowserConfig`):
- closed network flags and prefs (no background networking, component update, sync, first-run, extensions;
  WebRTC on proxied connections only, no DNS prefetch), downloads denied, a fresh profile per browser;
- when this process is root, Chromium runs as an unprivileged user (`nobody`) with its own sandbox on; task
  files that user cannot read are copied into the browser's private directory (`expose_directory`); if the
  sandbox cannot start on this machine, it falls back to --no-sandbox and says why (`sandbox_note`);
- bounded memory: every Chromium process starts under RLIMIT_DATA = `memory_limit_mb` (the launcher wrapper), and
  all a worker's browsers together stay under one bound (`env.browser_memory_mb`, memory_bound.py);
- no orphans: chromedriver gets PR_SET_PDEATHSIG (`set_parent_death_signal`, which follows the creating *thread*)
  and Chromium is exec'd under `setpriv --pdeathsig KILL`; the profile dir carries its owner's pid so a pool can
  delete those of dead owners (PROFILE_DIR_PREFIX).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import pwd
import shutil
import signal
import stat
import tempfile
from typing import Any

import psutil

from jaxwebrl.env.base import BrowserCrashed, PageFault

log = logging.getLogger(__name__)

INSTALL_HINT = "apt-get install -y chromium chromium-driver"
# + owner pid + "-" + random: one private temp dir per browser (WorkerPool deletes those of dead owners)
PROFILE_DIR_PREFIX = "jaxwebrl-chromium-"
PR_SET_PDEATHSIG = 1
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
    memory_limit_mb: each Chromium process's data memory (RLIMIT_DATA: heap and anonymous mappings, JS heap and
        ArrayBuffers alike), set by the launcher and inherited by every renderer; None: unbounded. Chosen over a
        V8 flag (bounds the JS heap only), RLIMIT_AS (V8 reserves far more address space than it uses and would
        not start) and a cgroup (needs delegation this process rarely has in a container). A page that hits it
        crashes its own tab (a PageFault naming the limit) or sees its allocation fail; the browser tree stays
        bounded by processes x limit (one page: 4.8 GB unbounded before), and a worker's browsers together by the
        watchdog of memory_bound.py.
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
    memory_limit_mb: int | None = 4096


def check_installation(config: BrowserConfig) -> None:
    """Raise a FileNotFoundError that says how to install Chromium/chromedriver when either is missing."""
    for what, path in (("Chromium", config.chromium_path), ("chromedriver", config.chromedriver_path)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"{what} not found at {path}: {INSTALL_HINT} (or set BrowserConfig paths)")


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when the thread that created it exits (Linux prctl
    PR_SET_PDEATHSIG). Runs in a chromedriver child between fork and exec, and first thing in a rollout worker
    process. Elsewhere than Linux it does nothing (the owners' cleanup still applies)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
        pass


def readable_by_others(path: str) -> bool:
    """Whether an unprivileged user can read `path` (others may read it and traverse every parent)."""
    path = os.path.abspath(path)
    if not os.stat(path).st_mode & stat.S_IROTH:
        return False
    parent = os.path.dirname(path)
    while True:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


class ChromiumProcess:
    """chromedriver + one Chromium with a fresh profile in a private temporary directory (see module docstring).

    `driver` is the Selenium WebDriver; `sandboxed` / `sandbox_note` say whether Chromium's sandbox runs and why
    not. `proxy_address` ("socks5://127.0.0.1:PORT"): route every connection of the browser through it.
    """

    def __init__(self, config: BrowserConfig, *, proxy_address: str | None = None):
        check_installation(config)
        self.config = config
        self.proxy_address = proxy_address
        self.driver = None
        self.sandboxed = False
        self.sandbox_note = ""
        self.tmpdir: str | None = None
        self._service = None
        self._uid, self._gid = self._target_user()
        self._exposed: dict[str, str] = {}
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        from selenium import webdriver  # deferred (heavy): selenium only where a browser is really started

        self.tmpdir = tempfile.mkdtemp(prefix=f"{PROFILE_DIR_PREFIX}{os.getpid()}-")  # owner pid: see the sweep
        os.chmod(self.tmpdir, 0o711)
        profile, home = os.path.join(self.tmpdir, "profile"), os.path.join(self.tmpdir, "home")
        for path in (profile, home):
            self._private_dir(path)
        sandbox_wanted = self.config.sandbox
        if os.geteuid() == 0 and self._uid is None:
            if sandbox_wanted is True:
                raise RuntimeError("sandbox=True needs a non-root browser user: set BrowserConfig.run_as_user")
            sandbox_wanted = False
            self.sandbox_note = "running as root without run_as_user: Chromium refuses its sandbox as root"
        attempts = [True, False] if sandbox_wanted == "auto" else [bool(sandbox_wanted)]
        errors = []
        for sandbox in attempts:
            try:
                self._launch(webdriver, profile, home, sandbox)
                self.sandboxed = sandbox
                break
            except Exception as exc:  # noqa: BLE001 - we retry once without the sandbox, then re-raise
                errors.append(f"sandbox={'on' if sandbox else 'off'}: {str(exc).splitlines()[0][:300]}")
                self.kill()
                self.driver = None
                shutil.rmtree(profile, ignore_errors=True)
                self._private_dir(profile)
        else:
            raise BrowserCrashed("Chromium did not start (" + "; ".join(errors) + f"). Is it installed? {INSTALL_HINT}")
        if not self.sandboxed:
            self.sandbox_note = self.sandbox_note or ("sandbox could not start: " + "; ".join(errors))
            if errors or self.config.sandbox == "auto":
                log.warning("Chromium runs with --no-sandbox: %s", self.sandbox_note)

    def _private_dir(self, path: str) -> None:
        os.mkdir(path, 0o700)
        if self._uid is not None:
            os.chown(path, self._uid, self._gid)

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
        from selenium.webdriver.chrome.service import Service  # deferred (heavy), as in _start

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
        if self.proxy_address is not None:  # loopback too: <-loopback> drops Chromium's implicit bypass of it
            flags += [f"--proxy-server={self.proxy_address}", "--proxy-bypass-list=<-loopback>", "--disable-quic"]
        for flag in flags:
            options.add_argument(flag)
        options.add_experimental_option("prefs", {
            **CLOSED_NETWORK_PREFS,
            "download_restrictions": 3,  # block all downloads
            "download.prompt_for_download": False,
            "download.default_directory": os.path.join(self.tmpdir, "no-downloads"),
            "profile.default_content_setting_values.notifications": 2,
            "profile.default_content_setting_values.geolocation": 2,
        })
        popen_kw: dict[str, Any] = {"start_new_session": True}
        if self.config.kill_with_parent:
            popen_kw["preexec_fn"] = set_parent_death_signal
        if self._uid is not None:
            popen_kw.update(user=self._uid, group=self._gid, extra_groups=[])
        env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": home,
               "XDG_CONFIG_HOME": home, "XDG_CACHE_HOME": home}
        self._service = Service(self.config.chromedriver_path, env=env, popen_kw=popen_kw, log_output=os.devnull)
        self.driver = webdriver.Chrome(options=options, service=self._service)
        _set_command_timeout(self.driver, self.config.command_timeout_s)   # a hung browser raises, never blocks
        self.driver.set_page_load_timeout(self.config.page_load_timeout_s)
        self.driver.set_script_timeout(self.config.command_timeout_s)

    def _chromium_launcher(self) -> str:
        """A tiny exec wrapper that bounds every Chromium process's data memory (`memory_limit_mb`: RLIMIT_DATA,
        inherited by the renderers) and makes Chromium die with chromedriver (setpriv --pdeathsig, when
        available)."""
        setpriv = shutil.which("setpriv") if self.config.kill_with_parent else None
        limit = self.config.memory_limit_mb
        if not setpriv and not limit:
            return self.config.chromium_path
        path = os.path.join(self.tmpdir, "chromium-launcher.sh")
        command = f'{setpriv} --pdeathsig KILL {self.config.chromium_path}' if setpriv else self.config.chromium_path
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + (f"ulimit -d {int(limit) * 1024}\n" if limit else "")
                    + f'exec {command} "$@"\n')
        os.chmod(path, 0o755)
        return path

    def expose_directory(self, directory: str) -> str:
        """A path to `directory` that the browser user can read: itself, or a private read-only copy."""
        directory = os.path.abspath(directory)
        if not os.path.isdir(directory):
            raise PageFault(f"the start page's folder {directory} does not exist; fix the task's start_url")
        if self._uid is None or readable_by_others(directory):
            return directory
        if directory not in self._exposed:
            target = os.path.join(self.tmpdir, "files", os.path.basename(directory))
            shutil.copytree(directory, target)
            for root, dirs, files in os.walk(os.path.join(self.tmpdir, "files")):
                os.chmod(root, 0o755)
                for name in files:
                    os.chmod(os.path.join(root, name), 0o644)
            self._exposed[directory] = target
        return self._exposed[directory]

    def process_ids(self) -> list[int]:
        """chromedriver and every Chromium process under it (for crash tests and leak checks)."""
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
        proc = getattr(self._service, "process", None)
        try:
            children = psutil.Process(proc.pid).children() if proc else []
        except psutil.NoSuchProcess:
            return None
        return children[0].pid if children else None

    def kill(self) -> None:
        """SIGKILL chromedriver's session and every process under it (they may belong to the browser user)."""
        service, self._service = self._service, None
        proc = getattr(service, "process", None)
        if proc is None:
            return
        pids = []
        try:
            pids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:  # already gone
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

    def close(self, *, quit_driver: bool = True) -> None:
        """Quit chromedriver (unless it is known broken), kill what is left, delete the profile. Never raises."""
        driver, self.driver = self.driver, None
        if driver is not None and quit_driver:
            try:
                _set_command_timeout(driver, 5.0)
                driver.quit()
            except Exception:  # noqa: BLE001 - close must always succeed; we kill below anyway
                pass
        self.kill()
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def _set_command_timeout(driver, seconds: float) -> None:
    """The HTTP timeout of every WebDriver command (a hung browser then raises instead of blocking)."""
    executor = driver.command_executor
    config = getattr(executor, "client_config", None) or getattr(executor, "_client_config", None)
    if config is not None:
        config.timeout = seconds
