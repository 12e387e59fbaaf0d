"""URL allowlist patterns: scheme, host, port and path matched separately, Chromium's URL normalisation, the
WebSocket twins, origin checks for the egress proxy, and one-line errors for patterns that are not URLs."""

import pytest

from jaxwebrl.env.browser.allowlist import UrlAllowlist


def test_host_wildcards_never_match_across_the_path():
    """The issue's bypass: fnmatch let `*` in the host eat the path of another host's URL."""
    allow = UrlAllowlist(["http://*.example.com/*"])
    for outside in ("http://127.0.0.1:8123/x.example.com/evil.html",
                    "http://127.0.0.1:8123/x.example.com/",
                    "http://evil.com/.example.com/",
                    "http://evil.com?.example.com/",
                    "http://evil.com#.example.com/",
                    "http://a.example.com@evil.com/",
                    "http://evil.com\\.example.com/",
                    "http://evil.com:80/.example.com/",
                    "http://example.com/",               # `*.` needs a label before the dot
                    "https://a.example.com/",            # another scheme
                    "http://a.example.com:8080/"):       # another port (no port in the pattern = the default)
        assert not allow.allows(outside), outside
    for inside in ("http://a.example.com/", "http://a.b.example.com/x/y?z=1", "HTTP://A.EXAMPLE.COM/x#frag",
                   "http://a.example.com:80/x", "ws://a.example.com/socket"):
        assert allow.allows(inside), inside


def test_matching_rules():
    allow = UrlAllowlist(["http://127.0.0.1:8000/*", "https://example.org/docs/", "http://exact.test/a.html",
                          "http://127.0.0.1:*/open/*", "wss://live.test/feed"])
    assert allow.allows("http://127.0.0.1:8000/index.html#frag")
    assert allow.allows("HTTP://127.0.0.1:8000/a/b?q=1")
    assert not allow.allows("http://127.0.0.1:8001/index.html")
    assert allow.allows("http://127.0.0.1:9999/open/x") and not allow.allows("http://127.0.0.1:9999/closed/x")
    assert allow.allows("https://example.org/docs/page") and not allow.allows("https://example.org/admin")
    assert not allow.allows("https://example.org/docs/../admin") and not allow.allows("https://example.org/docs/%2e%2e/admin")
    assert allow.allows("http://exact.test/a.html") and not allow.allows("http://exact.test/b.html")
    assert allow.allows("ws://127.0.0.1:8000/live") and allow.allows("https://live.test/feed")  # twins
    assert not allow.allows("ws://127.0.0.1:8001/live")
    assert allow.allows("about:blank") and not allow.allows("data:text/html,hi")
    assert not allow.allows("http://127.0.0.1:notaport/") and not allow.allows("http://127.0.0.1%2f:8000/")
    files = UrlAllowlist.for_directory("/tasks/shop")
    assert files.allows("file:///tasks/shop/index.html") and files.allows("file://localhost/tasks/shop/a/b.html")
    assert not files.allows("file:///tasks/shop/../secret.html")
    assert not files.allows("file:///tasks/shop/%2E%2E/secret.html")
    assert not files.allows("file:///tasks/shop\\..\\secret.html")
    assert not files.allows("file:///tasks/shopping/index.html")
    assert not files.allows("file:///etc/passwd")


def test_origin_checks_for_connections_without_a_visible_path():
    allow = UrlAllowlist(["http://127.0.0.1:8000/app/*", "https://*.example.com/*"])
    assert allow.allows_origin("http", "127.0.0.1", 8000) and allow.allows_origin("ws", "127.0.0.1", 8000)
    assert not allow.allows_origin("http", "127.0.0.1", 8001)
    assert allow.allows_origin("https", "a.example.com", 443) and allow.allows_origin("wss", "A.example.com", 443)
    assert not allow.allows_origin("https", "a.example.com", 8443)
    assert not allow.allows_origin("http", "a.example.com", 443)


@pytest.mark.parametrize("pattern, message", [
    ("127.0.0.1:8000/*", "not a URL pattern"),
    ("http:///x", "names no host"),
    ("http://h:eighty/*", "port must be a number"),
    ("http://user@h/*", "may not hold '@'"),
    ("", "non-empty URL pattern"),
])
def test_bad_patterns_are_named(pattern, message):
    with pytest.raises(ValueError, match=message):
        UrlAllowlist([pattern])
    with pytest.raises(TypeError):
        UrlAllowlist("http://x/*")
