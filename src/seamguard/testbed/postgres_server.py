"""A real Debian-packaged PostgreSQL on a free loopback port, in a temporary directory (tests, benchmarks).

The shared ledger of an HA controller (ledger/postgres.py) is tested on the server
operators run, not a fake. PostgreSQL refuses to run as root, so when the caller is root
the server (initdb, then postgres) runs as the unprivileged ``nobody`` through
``setpriv``, in a fresh directory under the system temp dir that it owns (a pytest
``tmp_path`` sits in root's private folder, which ``nobody`` cannot enter). The data
directory is throwaway: ``fsync=off``, trust authentication on loopback and a unix
socket in the same directory. Started and stopped by the caller (a context manager), the
directory removed also on failure. A missing binary raises `MissingBinary` naming the
package — never a skip.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from seamguard.ports import free_port
from seamguard.testbed.prom import MissingBinary

PG_ROOT = Path("/usr/lib/postgresql")
UNPRIVILEGED = "nobody"
DB_USER = "seamguard"


def pg_bin_dir(root: Path = PG_ROOT) -> Path:
    """The newest installed server's bin directory (/usr/lib/postgresql/<major>/bin)."""
    majors = sorted((p for p in root.glob("*/bin/postgres") if re.fullmatch(r"\d+", p.parent.parent.name)),
                    key=lambda p: int(p.parent.parent.name))
    if not majors:
        raise MissingBinary(f"no PostgreSQL server under {root}: install the Debian package 'postgresql'")
    return majors[-1].parent


def _as_unprivileged() -> list[str]:
    """The prefix that runs a command as ``nobody`` when we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return []
    import pwd

    pw = pwd.getpwnam(UNPRIVILEGED)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]


class PostgresServer:
    def __init__(self, database: str = "postgres") -> None:
        self.port = free_port()
        self.database = database
        self.workdir: Path | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"postgresql://{DB_USER}@127.0.0.1:{self.port}/{self.database}"

    def url_for(self, database: str) -> str:
        return f"postgresql://{DB_USER}@127.0.0.1:{self.port}/{database}"

    def start(self, timeout_s: float = 30.0) -> PostgresServer:
        bindir = pg_bin_dir()
        prefix = _as_unprivileged()
        self.workdir = Path(tempfile.mkdtemp(prefix="seamguard-pg-"))
        try:
            if prefix:
                import pwd

                pw = pwd.getpwnam(UNPRIVILEGED)
                os.chown(self.workdir, pw.pw_uid, pw.pw_gid)
            data = self.workdir / "data"
            init = subprocess.run([*prefix, str(bindir / "initdb"), "-D", str(data), "-U", DB_USER,
                                   "--auth=trust", "--encoding=UTF8", "--no-sync"],
                                  capture_output=True, text=True, timeout=120, check=False)
            if init.returncode != 0:
                raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr.strip()[-500:]}")
            with open(self.workdir / "postgres.log", "wb") as log:
                self._proc = subprocess.Popen(
                    [*prefix, str(bindir / "postgres"), "-D", str(data), "-p", str(self.port),
                     "-k", str(self.workdir), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                     "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=50"],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                pass
            assert self._proc is not None
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log = (self.workdir / "postgres.log").read_text(errors="replace")[-800:] if self.workdir else ""
                raise RuntimeError(f"PostgreSQL did not accept connections on port {self.port}: {log}")
            time.sleep(0.1)

    def create_database(self, name: str) -> str:
        """A fresh, empty database on this server; its URL."""
        import psycopg

        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", name):
            raise ValueError(f"database name {name!r}: lower-case letters, digits and _ only")
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url_for(name)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
                try:
                    self._proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout_s)
            self._proc = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
