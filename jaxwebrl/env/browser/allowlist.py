"""Navigation allowlists: which URLs a task's browser may load (pages, subresources, popups, WebSockets).

A pattern is a URL whose parts are matched separately: scheme, host, port and path (with the query). `*` is
the only wildcard. In the scheme and host it never leaves that part (`*` in a host matches letters, digits,
dots and dashes, never `/`, `:` or `@`); in the path it matches anything. So "http://*.example.com/*" allows
http://a.example.com/x and http://a.b.example.com/, but not http://127.0.0.1:8000/x.example.com/ (whose host
is 127.0.0.1). A pattern without a port allows the scheme's default port only; `:*` allows any port.
A pattern without `*` matches that URL exactly, and everything below it when it ends with "/".
`UrlAllowlist.for_directory` confines file:// to one folder. "about:blank" is always allowed.

WebSocket URLs are matched as their HTTP twins (ws:// as http://, wss:// as https://): a page's WebSocket may
go where the page may. URLs are normalised the way Chromium does before matching: scheme and host lower-cased,
`\\` read as `/` and tabs/newlines dropped in http(s)/ws(s)/file URLs, `.`/`..` (also `%2e`) resolved in the
path, the fragment dropped; a host with `%` or a port that is not a number never matches.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
import urllib.parse
from typing import Sequence

ALWAYS_ALLOWED_URLS = ("about:blank",)
DEFAULT_PORTS = {"http": 80, "https": 443, "ftp": 21}
SCHEME_TWINS = {"ws": "http", "wss": "https"}  # matched as
_SPECIAL_SCHEMES = ("http", "https", "ws", "wss", "ftp", "file")
_URL_NOISE = re.compile(r"[\t\n\r]")
_HOST_CHARS = r"[a-z0-9.\-\[\]_~!$&'()+,;=]"  # what `*` may stand for in a host (no '/', ':', '@', '%')


@dataclasses.dataclass(frozen=True)
class UrlParts:
    """A normalised URL split for matching: scheme (ws/wss as http/https), host ('' for file://), port (None for
    schemes without one) and path with its query ('?q' appended)."""

    scheme: str
    host: str
    port: int | None
    path: str


def split_url(url: str) -> UrlParts | None:
    """The parts Chromium would load for ``url``; None when it cannot be matched safely (bad port, `%` in host)."""
    text = _URL_NOISE.sub("", url).strip(" \x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f"
                                       "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f")
    scheme = text.split(":", 1)[0].lower() if ":" in text else ""
    if scheme in _SPECIAL_SCHEMES:
        text = text.replace("\\", "/")
    parts = urllib.parse.urlsplit(text)
    scheme = SCHEME_TWINS.get(parts.scheme.lower(), parts.scheme.lower())
    try:
        host, port = (parts.hostname or ""), parts.port
    except ValueError:  # a port that is not a number
        return None
    if "%" in host:
        return None
    if scheme == "file" and host == "localhost":
        host = ""
    if port is None:
        port = DEFAULT_PORTS.get(scheme)
    return UrlParts(scheme, host, port, _path_with_query(parts, hierarchical=bool(parts.netloc) or scheme == "file"))


def _path_with_query(parts, hierarchical: bool) -> str:
    path = parts.path
    if hierarchical:
        path = re.sub("%2e", ".", path, flags=re.IGNORECASE)
        trailing = path.endswith("/") or path.endswith("/.") or path.endswith("/..")
        path = posixpath.normpath("/" + path.lstrip("/")) if path else "/"
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        if trailing and not path.endswith("/"):
            path += "/"
    return path + ("?" + parts.query if parts.query else "")


@dataclasses.dataclass(frozen=True)
class _Pattern:
    text: str
    scheme: re.Pattern
    host: re.Pattern
    port: str | None  # digits, "*", or None (the scheme's default port)
    path: str
    wildcard_path: re.Pattern | None  # None: exact path (or prefix when it ends with "/")

    def allows_origin(self, url: UrlParts) -> bool:
        if not (self.scheme.fullmatch(url.scheme) and self.host.fullmatch(url.host)):
            return False
        if self.port == "*":
            return True
        wanted = int(self.port) if self.port is not None else DEFAULT_PORTS.get(url.scheme)
        return wanted == url.port

    def allows(self, url: UrlParts) -> bool:
        if not self.allows_origin(url):
            return False
        if self.wildcard_path is not None:
            return self.wildcard_path.fullmatch(url.path) is not None
        return url.path == self.path or (self.path.endswith("/") and url.path.startswith(self.path))


def _glob(text: str, star: str) -> re.Pattern:
    return re.compile(star.join(re.escape(piece) for piece in text.split("*")), re.DOTALL)


def compile_pattern(pattern: str) -> _Pattern:
    """A pattern's matcher; ValueError naming the pattern when it is not scheme://host[:port]/path or file:///path."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise ValueError(f"allowlist pattern {pattern!r} must be a non-empty URL pattern, e.g. 'http://127.0.0.1:8000/*'")
    text = pattern.strip()
    match = re.fullmatch(r"([A-Za-z0-9+.\-*]+)://([^/?#]*)(.*)", text)
    if not match:
        raise ValueError(f"allowlist pattern {pattern!r} is not a URL pattern: give scheme://host[:port]/path, "
                         "e.g. 'http://127.0.0.1:8000/*' or 'file:///tasks/shop/*'")
    scheme, netloc, rest = match.group(1).lower(), match.group(2).lower(), match.group(3)
    scheme = SCHEME_TWINS.get(scheme, scheme)
    if "@" in netloc or "%" in netloc:
        raise ValueError(f"allowlist pattern {pattern!r}: the host may not hold '@' or '%'")
    host, port = netloc, None
    bracket = netloc.rfind("]")
    colon = netloc.rfind(":")
    if colon > bracket:
        host, port = netloc[:colon], netloc[colon + 1:]
        if not (port == "*" or port.isdigit()):
            raise ValueError(f"allowlist pattern {pattern!r}: the port must be a number or '*'")
    host = host.strip("[]")
    if scheme == "file" and host == "localhost":
        host = ""
    if scheme != "file" and not host:
        raise ValueError(f"allowlist pattern {pattern!r} names no host")
    parts = urllib.parse.urlsplit("x://h" + (rest.split("#", 1)[0] or "/"))
    if "*" in rest:
        path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        wildcard = _glob(path, ".*")
    else:
        path, wildcard = _path_with_query(parts, hierarchical=True), None
    return _Pattern(text, _glob(scheme, "[a-z0-9+.\\-]*"), _glob(host, _HOST_CHARS + "*"), port, path, wildcard)


class UrlAllowlist:
    """URL patterns (see module docstring), e.g. "http://127.0.0.1:8000/*", "http://*.example.com/*",
    "file:///tasks/x/*". ValueError on a pattern that is not a URL pattern."""

    def __init__(self, patterns: Sequence[str] = ()):
        if isinstance(patterns, str):
            raise TypeError("UrlAllowlist takes a list of patterns, not one string")
        self._compiled = [compile_pattern(p) for p in patterns]
        self.patterns = tuple(p.text for p in self._compiled)

    @classmethod
    def for_directory(cls, directory: str, extra: Sequence[str] = ()) -> "UrlAllowlist":
        root = os.path.abspath(directory).rstrip("/")
        return cls([f"file://{urllib.parse.quote(root)}/*", *extra])

    def allows(self, url: str) -> bool:
        """May the browser load ``url``?"""
        if not isinstance(url, str):
            return False
        if url.strip() in ALWAYS_ALLOWED_URLS:
            return True
        parts = split_url(url)
        return parts is not None and any(p.allows(parts) for p in self._compiled)

    def allows_origin(self, scheme: str, host: str, port: int) -> bool:
        """May the browser connect to scheme://host:port at all (some path of it is allowed)? For connections
        whose path cannot be seen (TLS), e.g. in the egress proxy."""
        scheme = SCHEME_TWINS.get(scheme.lower(), scheme.lower())
        parts = UrlParts(scheme, host.lower().strip("[]"), int(port), "/")
        return any(p.allows_origin(parts) for p in self._compiled)

    def __repr__(self):
        return f"UrlAllowlist({list(self.patterns)!r})"


def blocked_message(url: str) -> str:
    return f"navigation to {url!r} is outside the task allowlist; returned to the task page"
