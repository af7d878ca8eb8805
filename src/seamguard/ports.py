"""A free TCP port on this host, for servers and process groups that start on "any port"."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS had free a moment ago (bind to 0, read it back, release it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
