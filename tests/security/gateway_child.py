"""`seamguard gateway` as a child process, for the attacks that need the real process: its
peak memory (/proc/<pid>/status VmHWM), its reaction to SIGTERM, and everything it printed.

Used by tests/security/test_gateway_surface*.py. The child runs this worktree's src (the
PYTHONPATH of tests/conftest.subprocess_env), with a SQLite store in the test's tmp_path.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from seamguard.ports import free_port
from tests.conftest import subprocess_env
from tests.gateway.conftest import ADMIN_TOKEN, base_config


def child_config(backend_url: str, tmp_path: Path, port: int, **over: Any) -> dict[str, Any]:
    return {**base_config(backend_url, {"type": "sqlite", "path": str(tmp_path / "gw.db")}, **over),
            "host": "127.0.0.1", "port": port}


class GatewayChild:
    """`python -m seamguard gateway --config <cfg>` with the admin token in its environment;
    `start` waits (bounded) for /healthz; `stop` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, tmp_path: Path, cfg: dict[str, Any], env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.dir = tmp_path
        self.port = cfg["port"]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cfg_path = tmp_path / "gateway.json"  # JSON is YAML
        self.cfg_path.write_text(json.dumps(cfg))
        self.env = {**subprocess_env(), "SEAMGUARD_GATEWAY_TOKEN": ADMIN_TOKEN, **(env or {})}
        self.args = args
        self.out_path, self.err_path = tmp_path / "gateway.out", tmp_path / "gateway.err"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> GatewayChild:
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "seamguard", "gateway", "--config",
                                          str(self.cfg_path), *self.args], stdout=out, stderr=err, env=self.env)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}: {self.output()[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway not up in {timeout_s:g} s: {self.output()[-2000:]}")
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def peak_rss_bytes(self) -> int:
        """The process's peak resident memory so far (VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/<pid>/status")

    def output(self) -> str:
        """Everything it wrote to stdout and stderr so far."""
        return "".join(p.read_text(errors="replace") for p in (self.out_path, self.err_path) if p.exists())

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int | None:
        """Its exit status, or None if it is still running after ``timeout_s``."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.terminate()
        if self.wait(10.0) is None:
            self.proc.kill()
            self.proc.wait(10.0)

    def __enter__(self) -> GatewayChild:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def child_port() -> int:
    return free_port("127.0.0.1")


def post_raw(url: str, path: str, headers: dict[str, str], total_bytes: int, chunked: bool,
             chunk_bytes: int = 1 << 20, timeout_s: float = 60.0) -> int | None:
    """POST ``total_bytes`` of body (spaces inside a JSON string, generated as it is sent, so this
    process never holds it) over a raw socket; the status the server answers, or None if it closed
    the connection without one. Sending stops as soon as the server answers or closes."""
    host, port = url.removeprefix("http://").split(":")
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
            *(f"{k}: {v}" for k, v in headers.items())]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total_bytes}")
    prefix = b'{"model": "fake-model", "messages": [{"role": "user", "content": "'
    suffix = b'"}]}'
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        s.setblocking(False)
        got = b""
        sent = 0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                data = s.recv(65536)
                if not data:
                    break
                got += data
                if b"\r\n" in got:
                    break
            except BlockingIOError:
                pass
            except OSError:
                break
            if sent < total_bytes:
                n = min(chunk_bytes, total_bytes - sent)
                piece = (prefix if sent == 0 else b"") + b" " * n
                piece = piece[:n] if sent + n < total_bytes else piece[:n - len(suffix)] + suffix
                frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece
                try:
                    s.setblocking(True)
                    s.settimeout(5.0)
                    s.sendall(frame)
                    sent += n
                    if chunked and sent >= total_bytes:
                        s.sendall(b"0\r\n\r\n")
                except OSError:
                    pass   # the server stopped reading (it answered, or is about to)
                finally:
                    s.setblocking(False)
            else:
                time.sleep(0.01)
    if not got.startswith(b"HTTP/1.1 "):
        return None
    return int(got.split(b" ", 2)[1])


def rss_settle(child: GatewayChild, s: float = 0.2) -> int:
    """Its peak RSS after a short pause (the gateway's own lazy setup done)."""
    time.sleep(s)
    return child.peak_rss_bytes()

