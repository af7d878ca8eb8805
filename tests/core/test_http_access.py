"""seamguard.http_access, the Host rule and bearer match both HTTP ports share, as decision tables."""

from __future__ import annotations

import pytest

from seamguard.http_access import Bearers, HostRule, host_of, token_digest

HOSTS = [
    # (case, bind address, allowed names, Host header, answered)
    ("loopback address with port", "127.0.0.1", [], "127.0.0.1:8642", True),
    ("localhost, upper case, trailing dot", "127.0.0.1", [], "LOCALHOST.:8642", True),
    ("an empty port", "127.0.0.1", [], "localhost:", True),
    ("IPv6 loopback", "::1", [], "[::1]:8642", True),
    ("an IPv6 address spelt long", "127.0.0.1", [], "[0:0:0:0:0:0:0:1]", True),
    ("any address", "0.0.0.0", [], "10.4.0.17:8642", True),
    ("a bracketed wildcard bind adds no name", "[::]", [], "attacker.example", False),
    ("a rebinding domain", "127.0.0.1", [], "attacker.example:8642", False),
    ("a domain that spells an address", "127.0.0.1", [], "127.0.0.1.nip.io", False),
    ("the bound name", "ctl.internal", [], "ctl.internal:8642", True),
    ("a configured name, case and dot", "0.0.0.0", ["GW.example.com."], "gw.example.com:443", True),
    ("a suffix pattern", "0.0.0.0", ["*.inference.internal"], "a.inference.internal", True),
    ("a look-alike of a configured name", "0.0.0.0", ["gw.example.com"], "gw.example.com.evil", False),
    ("a name ending in the suffix without its dot", "0.0.0.0", ["*.example.com"], "evil-example.com", False),
    ("the wildcard turns the check off", "0.0.0.0", ["*"], "anything.example", True),
    ("an unclosed bracket", "127.0.0.1", [], "[::1", False),
    ("a port that is not a number", "127.0.0.1", [], "localhost:x", False),
    ("a port of unicode digits", "127.0.0.1", [], "localhost:\u00b2", False),
    ("junk after the bracket", "127.0.0.1", [], "[::1]x", False),
    ("a name in brackets", "127.0.0.1", [], "[localhost]", False),
    ("a name with a path in it", "0.0.0.0", ["*.example.com"], "x/../a.example.com", False),
]


@pytest.mark.parametrize("case,bind,allowed,header,answered", HOSTS, ids=[h[0] for h in HOSTS])
def test_host_rule(case, bind, allowed, header, answered):
    assert HostRule.of(bind, allowed, answer_missing=False).allows(header) is answered


@pytest.mark.parametrize("answer_missing", [True, False])
def test_a_request_without_host_is_the_callers_choice(answer_missing):
    rule = HostRule.of("127.0.0.1", [], answer_missing=answer_missing)
    assert rule.allows(None) is answer_missing
    assert rule.allows("attacker.example") is False


def test_host_of_takes_the_port_off_and_normalises():
    assert host_of("[0:0::1]:8642") == "::1" and host_of("Example.COM.:80") == "example.com"
    assert host_of("") is None and host_of(None) is None and host_of("::1") is None


def test_bearers_name_the_token_presented():
    bearers = Bearers.of({"alice": "a" * 20}, {"prometheus": token_digest("p" * 20).hex()})
    assert bearers.who("a" * 20) == "alice" and bearers.who("p" * 20) == "prometheus"
    assert bearers.who("a" * 19) is None and bearers.who("") is None and bearers.who(None) is None
    assert not Bearers() and (Bearers() + bearers).who("a" * 20) == "alice"


def test_a_non_ascii_token_matches_the_header_bytes_as_sent():
    token = "p\u00e4sswort-\u20ac-0123456789"
    as_header = token.encode("utf-8").decode("latin-1")  # how an ASGI server hands the header over
    assert Bearers.of({"alice": token}).who(as_header) == "alice"


@pytest.mark.parametrize("pattern,ok", [("*", True), ("*.example.com", True), ("gw.example.com", True),
                                        ("10.0.0.1", True), ("[::1]", True), ("*foo", False), ("a*.b", False),
                                        ("*.", False), ("host:port", False), ("", False)])
def test_allowed_host_patterns(pattern: str, ok: bool) -> None:
    assert (HostRule.pattern_problem(pattern) is None) == ok
