"""Who may talk to `seamguard serve`: the operators' bearer tokens and the `Host` names it answers to.

Pure: tokens and names in, a decision out; the API's middleware (``api.py``) applies them
and the CLI reads the tokens file. The `Host` rule and the token match themselves are
``seamguard.http_access``'s, shared with the inference gateway; this module holds what is
the service's own: the tokens file, the unnamed token, and refusing a request without `Host`.

A token stands for a person: the audit trail (breaker resets, pins) records the name the
token was given, so each operator gets their own; a single unnamed token (``--token`` /
``SEAMGUARD_TOKEN``) acts as ``operator``.

The `Host` check stops DNS rebinding: a web page on an attacker's domain that resolves
that domain to 127.0.0.1 makes the victim's browser send its requests here with
``Host: attacker.example``; a service answering only to its own names gives that page
nothing. By default those names are loopback's (``localhost``) and the address it is bound
to; an address written as such (``127.0.0.1``, ``[::1]``, the pod's IP a kubelet probe
uses) is always answered, since rebinding needs a name the attacker controls; a malformed
`Host` is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from seamguard.config import parse_yaml
from seamguard.http_access import ANY_HOST, LOOPBACK_NAMES, Bearers, HostRule, host_of

__all__ = ["ANY_HOST", "LOOPBACK_HOSTS", "MIN_TOKEN_CHARS", "UNNAMED", "AccessConfigError", "HostRule",
           "allowed_hosts", "host_allowed", "host_of", "named_tokens", "parse_tokens_file", "token_owner",
           "tokens_from"]

UNNAMED = "operator"  # the audit name of a single unnamed token
MIN_TOKEN_CHARS = 16
LOOPBACK_HOSTS = LOOPBACK_NAMES
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


class AccessConfigError(ValueError):
    """A tokens file or allowed-host list that cannot be used; one line naming the file and the entry."""


def named_tokens(unnamed: str | None, named: Mapping[str, str] | None = None) -> dict[str, str]:
    """{name: token} from a single unnamed token and/or named ones; a token used twice is refused."""
    out: dict[str, str] = dict(named or {})
    if unnamed:
        if UNNAMED in out:
            raise AccessConfigError(f"--token acts as {UNNAMED!r}, which the tokens file also names")
        out[UNNAMED] = unnamed
    seen: dict[str, str] = {}
    for name, tok in out.items():
        if tok in seen:
            raise AccessConfigError(f"tokens of {seen[tok]!r} and {name!r} are the same; each operator needs their own")
        seen[tok] = name
    return out


def parse_tokens_file(text: str | bytes, source: str) -> dict[str, str]:
    """A YAML mapping operator name -> bearer token (at least 16 characters, all distinct)."""
    return tokens_from(parse_yaml(text, source, "tokens file", AccessConfigError), source)


def tokens_from(data: Any, source: str) -> dict[str, str]:
    """{name: token} from a parsed tokens file; AccessConfigError names the file and the entry."""
    if not isinstance(data, dict) or not data:
        raise AccessConfigError(f"{source}: a tokens file maps each operator's name to their token "
                                "(`alice: <token>`), at least one")
    out: dict[str, str] = {}
    for name, tok in data.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise AccessConfigError(f"{source}: {str(name)[:80]!r}: a name is 1-64 letters, digits or ._@- "
                                    "(it is written into the audit trail)")
        if not isinstance(tok, str) or len(tok) < MIN_TOKEN_CHARS or tok != tok.strip():
            raise AccessConfigError(f"{source}: {name}: the token must be a string of at least {MIN_TOKEN_CHARS} "
                                    "characters without surrounding spaces")
        out[name] = tok
    try:
        return named_tokens(None, out)
    except AccessConfigError as e:
        raise AccessConfigError(f"{source}: {e}") from None


def token_owner(presented: str, tokens: Mapping[str, str]) -> str | None:
    """The name whose token was presented, or None. Every token is compared, in constant time each
    (``http_access.Bearers``, shared with the gateway)."""
    return Bearers.of(tokens).who(presented)


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> HostRule:
    """Loopback's names, the bound address (unless a wildcard) and ``extra`` (``*.example.com`` a
    suffix, ``*`` any). IP addresses need not be listed: every address is answered. A request
    without `Host` is refused (every HTTP/1.1 client sends one); the gateway answers it."""
    return HostRule.of(bind_host, extra, answer_missing=False)


def host_allowed(header: str | None, allowed: HostRule) -> bool:
    """Whether a request naming ``header`` in `Host` is answered (``http_access.HostRule.allows``)."""
    return allowed.allows(header)
