"""Fault injection for seamguard's edges: a Prometheus fault proxy and fake Slurm commands.

`PromFaultProxy` is an HTTP server that stands in front of a real Prometheus (or, where
none is at hand, a function that answers queries) and, on cue, breaks what it forwards
the way real deployments do:

=============  ===========================================================================
``pass``       forward unchanged
``refuse``     stop listening: clients get *connection refused* (Prometheus down)
``status``     answer ``status_code`` (default 503) with a proxy's HTML page
``slow``       wait ``delay_s`` before answering
``drip``       send headers, then trickle the body ``chunk`` bytes every ``interval_s``
               (each read stays under any per-read timeout)
``huge``       a well-formed success answer of ``size_bytes``, streamed as generated
``malformed``  the upstream answer rewritten to break the API schema, by ``kind``:
               ``metric_not_object``, ``short_pair``, ``nan_strings``, ``wrong_types``,
               ``not_json``, ``not_object``, ``result_not_list``, ``wrong_result_type``,
               ``deep_nesting`` (see MALFORMED)
``partial``    keep only ``keep`` (a fraction) of the series
``truncate``   declare the full length, send ``keep`` of the bytes and close
=============  ===========================================================================

``declare_length=False`` sends no Content-Length (the body ends when the connection
closes), so a client cannot refuse a huge answer up front and must stop while reading.

``only`` restricts a fault to queries containing one of the given strings; others pass.
``proxy.requests`` counts what reached the proxy. Used by tests/test_faults.py and
benchmarks/fault_drill.py.

`SlurmCommandFaults` writes fake ``sinfo`` / ``scontrol`` scripts into a directory meant
to go first on ``PATH`` (``env()``). Each reads its mode from a file at every call, so a
test switches faults without restarting anything: ``pass`` (exec the real binary),
``hang``, ``garbage``, ``huge``, ``non_utf8``, ``fail`` (rc 1, like slurmctld down) and
``canned`` (print given rows: e.g. another owner's drain reason containing ``|``).
``scontrol`` in ``canned`` mode records its arguments and succeeds.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

MODES = ("pass", "refuse", "status", "slow", "drip", "huge", "malformed", "partial", "truncate")
MALFORMED = {
    "metric_not_object": "every series' `metric` is a list instead of an object",
    "short_pair": "every `value` is [ts] (a pair missing its value); matrix: the last point of each series",
    "nan_strings": "every sample value is the string 'NaN' (well-formed, unusable)",
    "wrong_types": "label values are numbers, sample values are objects, timestamps strings",
    "not_json": "an HTML page with status 200",
    "not_object": "a JSON list at the top level",
    "result_not_list": "data.result is an object",
    "wrong_result_type": "resultType 'scalar' for a vector query",
    "deep_nesting": "100,000 nested brackets (a JSON parser's recursion limit)",
}

# Answers a query: (path, form) -> (status, body). Stands in for a real Prometheus.
Answer = Callable[[str, dict[str, str]], tuple[int, bytes]]


@dataclass
class Fault:
    mode: str = "pass"
    only: tuple[str, ...] = ()  # query substrings the fault applies to (empty: all)
    status_code: int = 503
    delay_s: float = 0.0
    chunk: int = 16
    interval_s: float = 0.05
    size_bytes: int = 0
    kind: str = "metric_not_object"
    keep: float = 0.5
    declare_length: bool = True  # False: no Content-Length, the body ends when the connection closes
    params: dict[str, Any] = field(default_factory=dict)

    def applies(self, query: str) -> bool:
        return not self.only or any(s in query for s in self.only)


def _mangle(doc: Any, kind: str) -> Any:
    """The upstream's JSON answer, broken as ``kind`` says (vector or matrix)."""
    data = doc.get("data", {}) if isinstance(doc, dict) else {}
    result = data.get("result") if isinstance(data, dict) else None
    if kind == "not_object":
        return [doc]
    if kind == "result_not_list":
        data["result"] = {"0": result}
        return doc
    if kind == "wrong_result_type":
        data["resultType"] = "scalar"
        return doc
    for s in result if isinstance(result, list) else []:
        if kind == "metric_not_object":
            s["metric"] = list(s.get("metric", {}).items())
        elif kind == "short_pair":
            if "value" in s:
                s["value"] = s["value"][:1]
            if s.get("values"):
                s["values"][-1] = s["values"][-1][:1]
        elif kind == "nan_strings":
            if "value" in s:
                s["value"][1] = "NaN"
            for p in s.get("values", []):
                p[1] = "NaN"
        elif kind == "wrong_types":
            s["metric"] = {k: 7 for k in s.get("metric", {})}
            if "value" in s:
                s["value"] = [str(s["value"][0]), {"v": s["value"][1]}]
            for p in s.get("values", []):
                p[0], p[1] = str(p[0]), [p[1]]
    return doc


class PromFaultProxy:
    """``with PromFaultProxy(upstream=prom.url) as proxy: proxy.set("drip", interval_s=0.5)``"""

    def __init__(self, upstream: str | None = None, answer: Answer | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        if (upstream is None) == (answer is None):
            raise ValueError("give exactly one of upstream (a Prometheus URL) or answer (a function)")
        self.upstream = upstream.rstrip("/") if upstream else None
        self.answer = answer
        self.host = host
        self.port = port
        self.fault = Fault()
        self.requests = 0
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=60.0) if upstream else None
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self) -> PromFaultProxy:
        self._listen()
        return self

    def __enter__(self) -> PromFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._unlisten()
        if self._client is not None:
            self._client.close()

    def _listen(self) -> None:
        if self._httpd is not None:
            return
        httpd = ThreadingHTTPServer((self.host, self.port), self._handler())
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="prom-fault-proxy", daemon=True)
        self._thread.start()

    def _unlisten(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd = None
        with self._lock:  # kept-alive connections go too: the server is down
            conns, self._conns = self._conns, set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ---- faults -------------------------------------------------------------------------
    def set(self, mode: str = "pass", **kw: Any) -> None:
        """Switch the fault (``mode`` from MODES; keywords are `Fault` fields)."""
        if mode not in MODES:
            raise ValueError(f"unknown fault mode {mode!r}; expected one of {', '.join(MODES)}")
        if mode == "malformed" and kw.get("kind", "metric_not_object") not in MALFORMED:
            raise ValueError(f"unknown malformed kind {kw.get('kind')!r}; expected one of {', '.join(MALFORMED)}")
        if "only" in kw and isinstance(kw["only"], str):
            kw["only"] = (kw["only"],)
        with self._lock:
            self.fault = Fault(mode=mode, **kw)
        if mode == "refuse" and not self.fault.only:
            self._unlisten()
        else:
            self._listen()

    def clear(self) -> None:
        self.set("pass")

    # ---- the server -----------------------------------------------------------------------
    def _forward(self, path: str, body: bytes, form: dict[str, str], ctype: str) -> tuple[int, bytes]:
        if self.answer is not None:
            return self.answer(path, form)
        assert self._client is not None and self.upstream is not None
        try:
            r = self._client.post(self.upstream + path, content=body, headers={"Content-Type": ctype})
        except httpx.HTTPError as e:
            return 502, f"upstream error: {type(e).__name__}".encode()
        return r.status_code, r.content

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *a: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with proxy._lock:
                    proxy._conns.add(self.connection)

            def finish(self) -> None:
                with proxy._lock:
                    proxy._conns.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def do_GET(self) -> None:
                self._serve(b"")

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self._serve(self.rfile.read(n) if n else b"")

            def _send(self, status: int, body: bytes, length: int | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if proxy.fault.declare_length:
                    self.send_header("Content-Length", str(len(body) if length is None else length))
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()

            def _serve(self, body: bytes) -> None:
                from urllib.parse import parse_qs, urlsplit

                with proxy._lock:
                    proxy.requests += 1
                    f = proxy.fault
                parts = urlsplit(self.path)
                form = {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
                form.update({k: v[-1] for k, v in parse_qs(parts.query).items()})
                query = form.get("query", "")
                try:
                    self._answer(f if f.applies(query) else Fault(), parts.path, body, form)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its deadline): that is the point of most faults

            def _answer(self, f: Fault, path: str, body: bytes, form: dict[str, str]) -> None:
                if f.mode == "refuse":  # only some queries: reset the connection
                    self.close_connection = True
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                    return
                if f.mode == "status":
                    page = b"<html><body><h1>503 Service Unavailable</h1>upstream overloaded</body></html>"
                    self._send(f.status_code, page)
                    self.wfile.write(page)
                    return
                if f.mode == "huge":
                    self._huge(f.size_bytes)
                    return
                if f.mode == "malformed" and f.kind in ("not_json", "deep_nesting"):
                    out = (b"<html>gateway</html>" if f.kind == "not_json" else b"[" * 100_000 + b"]" * 100_000)
                    self._send(200, out)
                    self.wfile.write(out)
                    return
                status, out = proxy._forward(path, body, form, self.headers.get("Content-Type", ""))
                if f.mode == "slow":
                    time.sleep(f.delay_s)
                if f.mode in ("malformed", "partial") and status == 200:
                    try:
                        doc = json.loads(out)
                    except ValueError:
                        doc = None
                    if doc is not None:
                        if f.mode == "malformed":
                            doc = _mangle(doc, f.kind)
                        else:
                            res = doc.get("data", {}).get("result", [])
                            doc["data"]["result"] = res[: int(len(res) * f.keep)]
                        out = json.dumps(doc).encode()
                if f.mode == "truncate":
                    self._send(status, b"", length=len(out))
                    self.wfile.write(out[: int(len(out) * f.keep)])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if f.mode == "drip":
                    self._send(status, out)
                    for i in range(0, len(out), max(f.chunk, 1)):
                        self.wfile.write(out[i:i + f.chunk])
                        self.wfile.flush()
                        time.sleep(f.interval_s)
                    return
                self._send(status, out)
                self.wfile.write(out)

            def _huge(self, size: int) -> None:
                head = b'{"status":"success","data":{"resultType":"vector","result":['
                one = b'{"metric":{"__name__":"x","Hostname":"nowhere","gpu":"0"},"value":[1,"1"]},'
                tail = b'{"metric":{},"value":[1,"1"]}]}}'
                n = max((size - len(head) - len(tail)) // len(one), 0)
                self._send(200, b"", length=len(head) + n * len(one) + len(tail))
                self.wfile.write(head)
                block = one * 4096
                left = n
                while left > 0:
                    k = min(left, 4096)
                    self.wfile.write(block if k == 4096 else one * k)
                    left -= k
                self.wfile.write(tail)

        return Handler


def vector_answer(samples: Iterable[tuple[dict[str, str], str]], t: float = 1.7e9) -> bytes:
    """A success answer to an instant query."""
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [t, v]} for m, v in samples]}}).encode()


def matrix_answer(series: Iterable[tuple[dict[str, str], list[tuple[float, str]]]]) -> bytes:
    """A success answer to a range query."""
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": m, "values": [[t, v] for t, v in pts]} for m, pts in series]}}).encode()


# ---- Slurm ------------------------------------------------------------------------------------
SLURM_MODES = ("pass", "hang", "garbage", "huge", "non_utf8", "fail", "canned")

_SCRIPT = """#!/bin/sh
# seamguard fault injection: a fake {cmd}; mode in {cmd}.mode (see seamguard.testbed.faults)
d="$(dirname "$0")"
mode="$(cat "$d/{cmd}.mode" 2>/dev/null || echo pass)"
echo "$*" >> "$d/{cmd}.calls"
case "$mode" in
  hang) sleep 3600 & sleep 3600 ;;
  garbage) printf '<html><body>502 Bad Gateway</body></html>\\n\\001\\002 ||||\\n%s\\n' '|||||||' ;;
  huge) yes 'x|y|z' | head -c {huge_bytes} ;;
  non_utf8) printf 'gpu000|drained|(null)|(null)|admin: \\377\\376 bad bytes\\n' ;;
  fail) echo "slurm_load_node: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
  canned) cat "$d/{cmd}.out" 2>/dev/null; exit 0 ;;
  *) exec {real} "$@" ;;
esac
"""


class SlurmCommandFaults:
    """Fake ``sinfo``/``scontrol`` in ``bin_dir``; put it first on PATH (``env()``)."""

    def __init__(self, bin_dir: Path, huge_bytes: int = 256 * 1024 * 1024) -> None:
        self.bin_dir = Path(bin_dir)
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        for cmd in ("sinfo", "scontrol"):
            real = shutil.which(cmd) or f"/usr/bin/{cmd}"
            p = self.bin_dir / cmd
            p.write_text(_SCRIPT.format(cmd=cmd, real=real, huge_bytes=int(huge_bytes)))
            p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            self.set(cmd, "pass")

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def set(self, cmd: str, mode: str, rows: Iterable[str] | None = None) -> None:
        """Switch ``cmd`` ('sinfo' or 'scontrol') to ``mode``; ``rows`` is what ``canned`` prints."""
        if cmd not in ("sinfo", "scontrol"):
            raise ValueError(f"cmd must be sinfo or scontrol, got {cmd!r}")
        if mode not in SLURM_MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(SLURM_MODES)}")
        if rows is not None:
            (self.bin_dir / f"{cmd}.out").write_text("".join(r + "\n" for r in rows))
        (self.bin_dir / f"{cmd}.mode").write_text(mode)

    def calls(self, cmd: str) -> list[str]:
        p = self.bin_dir / f"{cmd}.calls"
        return p.read_text().splitlines() if p.exists() else []


def sinfo_rows(nodes: Iterable[str], drained: dict[str, str] | None = None,
               features: dict[str, str] | None = None) -> list[str]:
    """Rows as ``sinfo -N -h -o "%N|%T|%f|%b|%E"`` prints them (reason last)."""
    drained = drained or {}
    features = features or {}
    out = []
    for n in nodes:
        feats = features.get(n, "(null)")
        state, reason = ("drained", drained[n]) if n in drained else ("idle", "none")
        out.append(f"{n}|{state}|{feats}|{feats}|{reason}")
    return out
