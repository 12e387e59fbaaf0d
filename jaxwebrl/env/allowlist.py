"""Navigation allowlists: which URLs a task's browser may load (pages, subresources, popups).

Patterns are globs (fnmatch) over normalised URLs, e.g. "http://127.0.0.1:8000/*" or "file:///tasks/shop/*";
`UrlAllowlist.for_directory` confines file:// to one folder. "about:blank" is always allowed.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import urllib.parse
from typing import Sequence

ALWAYS_ALLOWED_URLS = ("about:blank",)


class UrlAllowlist:
    """Glob patterns (fnmatch) over normalised URLs, e.g. "http://127.0.0.1:8000/*", "file:///tasks/x/*".

    A pattern without "*" matches that URL exactly and everything below it when it ends with "/".
    """

    def __init__(self, patterns: Sequence[str] = ()):
        if isinstance(patterns, str):
            raise TypeError("UrlAllowlist takes a list of patterns, not one string")
        self.patterns = tuple(_normalise_url(p) if "*" not in p else p for p in patterns)

    @classmethod
    def for_directory(cls, directory: str, extra: Sequence[str] = ()) -> "UrlAllowlist":
        root = os.path.abspath(directory).rstrip("/")
        return cls([f"file://{urllib.parse.quote(root)}/*", *extra])

    def allows(self, url: str) -> bool:
        url = _normalise_url(url)
        if url in ALWAYS_ALLOWED_URLS:
            return True
        for pattern in self.patterns:
            if "*" in pattern:
                if fnmatch.fnmatchcase(url, pattern):
                    return True
            elif url == pattern or (pattern.endswith("/") and url.startswith(pattern)):
                return True
        return False

    def __repr__(self):
        return f"UrlAllowlist({list(self.patterns)!r})"


def _normalise_url(url: str) -> str:
    """Lower-case scheme/host, resolve `..` in paths, drop fragments (they never leave the page)."""
    parts = urllib.parse.urlsplit(url.strip())
    path = parts.path
    if path:
        trailing = path.endswith("/")
        path = posixpath.normpath(path)
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        if trailing and not path.endswith("/"):
            path += "/"
    return urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def blocked_message(url: str) -> str:
    return f"navigation to {url!r} is outside the task allowlist; returned to the task page"
