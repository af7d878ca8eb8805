"""Starting and stopping the HTTP server around a runner (the CLI, tests, benchmarks).

`Server` runs uvicorn in a background thread on a given (or free) loopback port and
stops it with a bounded wait, so tests and benchmarks start and stop real servers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping

import uvicorn

from seamguard.app.service.access import allowed_hosts
from seamguard.app.service.api import create_app
from seamguard.app.runner import Runner
from seamguard.ports import free_port


class Server:
    def __init__(self, runner: Runner, token: str | Mapping[str, str], host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning", extra_hosts: Iterable[str] = ()) -> None:
        """``token``: one unnamed token or {operator name: token}; the service answers to `Host`
        names of loopback, ``host`` and ``extra_hosts`` (``access.allowed_hosts``)."""
        self.runner = runner
        self.host = host
        self.port = port or free_port(host)
        self.app = create_app(runner, token, allowed_hosts(host, extra_hosts))
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=self.port, log_level=log_level,
                                                     access_log=False, lifespan="off"))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> Server:
        self._thread = threading.Thread(target=self._server.run, name="seamguard-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"HTTP server did not start on {self.url} within {timeout_s:g} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)

    def request_stop(self) -> None:
        """Leave serve_forever (safe from a signal handler, also before it began)."""
        self._server.should_exit = True

    def serve_forever(self) -> None:
        """Run in the calling thread until interrupted (the CLI)."""
        self._server.run()
