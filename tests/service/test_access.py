"""Who may talk to `seamguard serve`: Host names (DNS rebinding) and named tokens, as decision tables."""

from __future__ import annotations

import pytest

from seamguard.app.service.access import (
    UNNAMED,
    AccessConfigError,
    allowed_hosts,
    host_allowed,
    named_tokens,
    parse_tokens_file,
    token_owner,
)

HOSTS = [
    # (case, bind address, --allowed-host, Host header, answered)
    ("loopback address with port", "127.0.0.1", [], "127.0.0.1:8642", True),
    ("localhost", "127.0.0.1", [], "localhost:8642", True),
    ("localhost, upper case, trailing dot", "127.0.0.1", [], "LOCALHOST.:8642", True),
    ("IPv6 loopback", "::1", [], "[::1]:8642", True),
    ("any address (a kubelet probe's pod IP)", "0.0.0.0", [], "10.4.0.17:8642", True),
    ("a rebinding domain", "127.0.0.1", [], "attacker.example:8642", False),
    ("a domain that spells an address", "127.0.0.1", [], "127.0.0.1.nip.io", False),
    ("a name the operator allowed", "0.0.0.0", ["ctl.example.com"], "ctl.example.com:8642", True),
    ("the bound name", "ctl.internal", [], "ctl.internal:8642", True),
    ("the wildcard turns the check off", "0.0.0.0", ["*"], "anything.example", True),
    ("no Host", "127.0.0.1", [], None, False),
    ("a malformed Host", "127.0.0.1", [], "[::1", False),
    ("a port that is not a number", "127.0.0.1", [], "localhost:x", False),
]


@pytest.mark.parametrize("case,bind,extra,header,answered", HOSTS, ids=[h[0] for h in HOSTS])
def test_host_allowed(case, bind, extra, header, answered):
    assert host_allowed(header, allowed_hosts(bind, extra)) is answered


def test_token_owner_names_the_operator():
    tokens = {"alice": "a" * 20, "bob": "b" * 20}
    assert token_owner("a" * 20, tokens) == "alice" and token_owner("b" * 20, tokens) == "bob"
    assert token_owner("c" * 20, tokens) is None and token_owner("", tokens) is None


def test_a_single_unnamed_token_acts_as_operator():
    assert named_tokens("t" * 20) == {UNNAMED: "t" * 20}


@pytest.mark.parametrize("text,problem", [
    ("alice: short\n", "at least 16"),
    ("alice: 1234567890123456\n", "must be a string"),
    ("'al ice': aaaaaaaaaaaaaaaaaaaa\n", "a name is"),
    ("alice: aaaaaaaaaaaaaaaaaaaa\nbob: aaaaaaaaaaaaaaaaaaaa\n", "are the same"),
    ("alice: aaaaaaaaaaaaaaaaaaaa\nalice: bbbbbbbbbbbbbbbbbbbb\n", "duplicate key 'alice'"),
    ("[]\n", "maps each operator"),
])
def test_tokens_file_errors_are_one_line(text, problem):
    with pytest.raises(AccessConfigError) as e:
        parse_tokens_file(text, "tokens.yaml")
    assert str(e.value).startswith("tokens.yaml: ") and problem in str(e.value) and "\n" not in str(e.value)
    assert "aaaa" not in str(e.value)  # a token is never repeated in a message


def test_unnamed_token_clashing_with_a_named_operator():
    with pytest.raises(AccessConfigError, match="also names"):
        named_tokens("t" * 20, {UNNAMED: "u" * 20})
