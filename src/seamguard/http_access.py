"""Who may talk to a seamguard HTTP port: the `Host` names it answers and the bearer tokens it takes.

Both ports use it: the controller's API (``seamguard serve``, app/service/access.py) and the
inference gateway (gateway/surface.py). It sits beside config.py and ports.py, below every
layer, because the gateway may not import the shell (pyproject's import contracts). Pure:
names and tokens in, a decision out; no I/O.

The `Host` check stops DNS rebinding: a web page on an attacker's domain that resolves that
domain to 127.0.0.1 makes the victim's browser send its requests here with
``Host: attacker.example``; a port answering only to its own names gives that page nothing.
The names answered are loopback's, the address bound (unless a wildcard) and configured ones
(``*.example.com`` a suffix, ``*`` any). An address written as such (``127.0.0.1``, ``[::1]``,
the pod IP a kubelet probe uses) is always answered: rebinding needs a name the attacker
controls. A malformed header (a port that is not a number, an unclosed bracket, characters no
host name has) is refused. Whether a request with no `Host` at all (HTTP/1.0) is answered is
each port's choice: `HostRule.of` takes it as ``answer_missing``.

Tokens are held as sha256 digests (`Bearers`) and a presented one is matched against every
one of them, each in constant time, so neither which token matched nor its length shows in
the time taken.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ANY_HOST = "*"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("", "0.0.0.0", "::")
_PORT = re.compile(r"[0-9]{0,5}")
_NAME_CHARS = re.compile(r"[a-z0-9._-]+")  # a registered name, lower-cased (RFC 3986 reg-name, no escapes)


# ---- Host (DNS rebinding) ----------------------------------------------------------------------
def normal_name(name: str) -> str:
    """A host name or address as compared: lower case, no IPv6 brackets, no trailing dot, an
    address in its canonical form (``0:0::1`` -> ``::1``)."""
    name = name.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_of(header: str | None) -> str | None:
    """The name in a `Host` header, port taken off (``[::1]:8642`` -> ``::1``); None when absent or malformed."""
    if not header:
        return None
    h = header.strip()
    if h.startswith("["):
        end = h.find("]")
        rest = h[end + 1:] if end >= 0 else ""
        if end < 0 or (rest and not (rest[0] == ":" and _PORT.fullmatch(rest[1:]))):
            return None
        name = normal_name(h[:end + 1])
        return name if ":" in name and is_address(name) else None  # brackets hold an IPv6 address only
    name, _, port = h.partition(":")
    if not name or not _PORT.fullmatch(port):
        return None
    name = normal_name(name)
    return name if is_address(name) or _NAME_CHARS.fullmatch(name) else None


@dataclass(frozen=True)
class HostRule:
    """The `Host` names a port answers (see the module docstring)."""

    names: frozenset[str]
    suffixes: tuple[str, ...] = ()
    any_host: bool = False
    answer_missing: bool = False

    @staticmethod
    def pattern_problem(pattern: str) -> str | None:
        """Why ``pattern`` is no allowed-host entry (a name, an address, ``*.suffix`` or ``*``), or None."""
        p = pattern.strip().lower()
        if p == ANY_HOST:
            return None
        name = (p[2:] if p.startswith("*.") else p).rstrip(".")
        if not name or "*" in name or host_of(name) is None:
            return f"{pattern!r} is not a host name, an address, '*.suffix' or '*'"
        return None

    @classmethod
    def of(cls, bind_host: str, allowed: Iterable[str] = (), *, answer_missing: bool) -> HostRule:
        """Loopback's names, ``bind_host`` (unless a wildcard) and ``allowed`` (``*.example.com``
        a suffix, ``*`` any). ``answer_missing``: whether a request without `Host` is answered."""
        names = set(LOOPBACK_NAMES)
        bound = normal_name(bind_host)
        if bound not in WILDCARD_BINDS:
            names.add(bound)
        extra = [a.strip().lower().rstrip(".") for a in allowed]
        names.update(normal_name(a) for a in extra if not a.startswith("*"))
        suffixes = tuple(a[1:] for a in extra if a.startswith("*."))
        return cls(frozenset(names), suffixes, ANY_HOST in extra, answer_missing)

    def allows(self, header: str | None) -> bool:
        """Whether a request naming ``header`` in `Host` is answered: an IP address, or a name this rule names."""
        if self.any_host:
            return True
        if header is None:
            return self.answer_missing
        name = host_of(header)
        return name is not None and (name in self.names or is_address(name)
                                     or any(name.endswith(s) for s in self.suffixes))


# ---- bearer tokens -----------------------------------------------------------------------------
def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def _presented_digest(presented: str) -> bytes:
    # a header's value arrives decoded as latin-1: encoding it back gives the bytes as sent
    return hashlib.sha256(presented.encode("latin-1", "replace")).digest()


@dataclass(frozen=True)
class Bearers:
    """Named bearer tokens held as sha256 digests; `who` matches one in constant time."""

    named: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def of(cls, tokens: Mapping[str, str] | None = None, digests: Mapping[str, str] | None = None) -> Bearers:
        """From plain tokens (name -> token) and sha256 hex digests (name -> hex)."""
        named = [(n, token_digest(t)) for n, t in (tokens or {}).items()]
        named += [(n, bytes.fromhex(h)) for n, h in (digests or {}).items()]
        return cls(tuple(named))

    def __bool__(self) -> bool:
        return bool(self.named)

    def __add__(self, other: Bearers) -> Bearers:
        return Bearers(self.named + other.named)

    def who(self, presented: str | None) -> str | None:
        """The name of the token presented (the first, where two share it), or None. Every digest
        is compared, matched or not."""
        if not presented:
            return None
        got = _presented_digest(presented)
        found = None
        for name, want in self.named:
            if hmac.compare_digest(got, want) and found is None:
                found = name
        return found
