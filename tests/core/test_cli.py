"""The `seamguard` command line as users and scripts meet it (issue 13, point 3).

- every table cell whole, piped and at 80 columns; no live progress outside a terminal;
- ``--version``; ``-o json`` (and ``--json``) is one JSON object on stdout's last line for
  every command that reports;
- a bad input is one ``error:`` line, exit status 2, no traceback;
- ``--help`` lists choices and shows flags as flags.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from seamguard.app.cli import app

SRC = str(Path(__file__).resolve().parents[2] / "src")
SMALL_DEMO = ["demo", "--gpus", "256", "--minutes", "6"]
COLUMN_NAMES = ("fault", "entity", "start", "detected", "delay", "first state", "evidence", "lead time", "action")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The command as a user runs it: stdout and stderr are pipes (not terminals)."""
    return subprocess.run([sys.executable, "-m", "seamguard", *args], env=env or _env(), capture_output=True,
                          text=True, timeout=timeout)


def _invoke(*args: str, **env: str):
    return CliRunner().invoke(app, list(args), env=env or None)


def _last_json(stdout: str) -> dict:
    lines = stdout.strip().splitlines()
    assert lines, "nothing on stdout"
    doc = json.loads(lines[-1])
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def small_demo() -> dict:
    """The small demo's result, from -o json: what the human view must show whole."""
    r = _cli(*SMALL_DEMO, "-o", "json")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 1, "-o json prints exactly one line on stdout"
    return json.loads(r.stdout)


def _assert_whole(text: str, result: dict, width: int | None) -> None:
    assert "…" not in text and "..." not in text
    for row in result["fault_table"]:
        for value in (row["fault"], row["entity"], *(row["evidence"]), *(row["action"] or "").split()):
            assert value in text, f"{value!r} not whole in:\n{text}"
    for name in COLUMN_NAMES:
        assert name in text
    if width is not None:
        too_long = [ln for ln in text.splitlines() if len(ln) > width]
        assert not too_long, too_long


# ---- seamguard demo, piped and at 80 columns ---------------------------------------------------


def test_demo_piped_shows_every_cell_whole_and_no_live_progress(small_demo):
    r = _cli(*SMALL_DEMO)  # stdout is a pipe: `seamguard demo | cat`
    assert r.returncode == 0, r.stderr
    _assert_whole(r.stdout, small_demo, width=80)  # rich's width for a pipe without COLUMNS
    assert "\x1b" not in r.stdout + r.stderr, "no colour codes or cursor movement in a pipe"
    assert "\r" not in r.stderr and "with control" not in r.stderr, "no progress when stderr is not a terminal"
    assert "detected / faults" in r.stdout and f"{small_demo['detected']} / {small_demo['faults']}" in r.stdout


@pytest.mark.parametrize("columns", [50, 80, 120])
def test_demo_narrow_terminal_shows_every_cell_whole(small_demo, columns):
    r = _invoke(*SMALL_DEMO, COLUMNS=str(columns))
    assert r.exit_code == 0, r.output
    _assert_whole(r.stdout, small_demo, width=columns)
    assert "┃" not in r.stdout, "the fault table does not fit: one record per fault instead"


def test_demo_wide_terminal_gets_the_table(small_demo):
    r = _invoke(*SMALL_DEMO, COLUMNS="250")
    assert r.exit_code == 0, r.output
    _assert_whole(r.stdout, small_demo, width=250)
    header = next(ln for ln in r.stdout.splitlines() if "┃ fault" in ln)
    assert all(f" {name} " in header for name in COLUMN_NAMES), header
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("│")]
    assert len(rows) == small_demo["faults"]


# ---- --version, -o json ----------------------------------------------------------------------


def test_version():
    r = _invoke("--version")
    assert r.exit_code == 0
    assert r.stdout.strip() == f"seamguard {version('seamguard')}"


def test_fleet_generate_and_validate_json_and_table(tmp_path):
    topo = tmp_path / "topo.yaml"
    r = _invoke("fleet", "generate", "--gpus", "64", "--seed", "3", "--out", str(topo), "-o", "json")
    assert r.exit_code == 0, r.output
    gen = _last_json(r.stdout)
    assert gen["out"] == str(topo) and gen["gpu"] == 64 and gen["node"] == 8
    assert yaml.safe_load(topo.read_text())  # written, and plain YAML
    r = _invoke("fleet", "validate", str(topo), "--json")
    assert r.exit_code == 0, r.output
    val = _last_json(r.stdout)
    assert val["valid"] is True and {k: val[k] for k in ("gpu", "node", "link")} == \
        {k: gen[k] for k in ("gpu", "node", "link")}
    assert r.stderr == "", "no progress output when stderr is not a terminal"
    table = _invoke("fleet", "validate", str(topo))
    assert table.exit_code == 0
    assert "gpu" in table.stdout and "64" in table.stdout and "valid" in table.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(table.stdout.strip().splitlines()[-1])


def test_policy_validate_json(tmp_path):
    pol = tmp_path / "p.yaml"
    pol.write_text("mode: enforce\n")
    r = _invoke("policy", "validate", str(pol), "-o", "json")
    assert r.exit_code == 0, r.output
    assert _last_json(r.stdout) == {"file": str(pol), "valid": True, "mode": "enforce"}


class _EmptyPrometheus(BaseHTTPRequestHandler):
    """A Prometheus API that knows no series: every query succeeds with an empty result."""

    def _answer(self) -> None:
        kind = "matrix" if self.path.split("?")[0].endswith("query_range") else "vector"
        body = json.dumps({"status": "success", "data": {"resultType": kind, "result": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer

    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prometheus():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyPrometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def topology(tmp_path) -> Path:
    topo = tmp_path / "topo.yaml"
    assert _invoke("fleet", "generate", "--gpus", "64", "--out", str(topo)).exit_code == 0
    return topo


def test_replay_of_a_window_without_data_says_so(tmp_path, prometheus, topology):
    """A window where Prometheus holds no sample of any mapped signal is not a clean backtest:
    the summary is printed, then one error line, exit 1 (it was exit 0 with an empty timeline)."""
    out = tmp_path / "events.jsonl"
    r = _cli("replay", "--prometheus", prometheus, "--topology", str(topology), "--start", "1000",
             "--end", "1090", "--step", "15", "--out", str(out), "-o", "json")
    assert r.returncode == 1, r.stderr
    assert _last_json(r.stdout) == {"out": str(out), "ticks": 7, "tick_errors": 0,
                                    "ticks_with_source_problems": 0, "ticks_with_data": 0}
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "no sample of any signal" in errors[0], r.stderr
    table = _cli("replay", "--prometheus", prometheus, "--topology", str(topology), "--start", "1000",
                 "--end", "1090", "--step", "15", "--out", str(out))
    assert table.returncode == 1 and "ticks" in table.stdout and "{" not in table.stdout


@pytest.mark.parametrize(("url", "needle"), [
    ("http://127.0.0.1:{closed}", "every query failed, e.g. prometheus:"),
    ("127.0.0.1:9090", "--prometheus: url must start with http:// or https://"),
])
def test_replay_against_a_bad_prometheus_is_one_error_line_before_any_output(tmp_path, topology, url, needle):
    import socket

    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    out = tmp_path / "events.jsonl"
    r = _cli("replay", "--prometheus", url.format(closed=closed), "--topology", str(topology), "--start", "1000",
             "--end", "1090", "--step", "15", "--out", str(out), timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
    assert not out.exists(), "the output is not created when the source cannot be read at all"


def test_run_json(tmp_path, prometheus, topology):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"version": 1, "topology": str(topology), "tick_s": 0.05,
                                   "ledger": str(tmp_path / "ledger.db"), "max_ticks": 2,
                                   "prometheus": {"url": prometheus}}))
    r = _cli("run", "--config", str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    assert _last_json(r.stdout) == {"ticks": 2, "mode": "dry_run", "ledger": str(tmp_path / "ledger.db")}


def _first_line(args: list[str], env: dict[str, str] | None = None) -> str:
    proc = subprocess.Popen([sys.executable, "-m", "seamguard", *args], env=_env(**(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.poll() is not None else "no startup line"
        return line
    finally:
        proc.terminate()
        proc.wait(20)


def test_twin_serve_startup_line_json_and_table():
    doc = json.loads(_first_line(["twin", "serve", "--gpus", "64", "--port", "0", "-o", "json"]))
    assert doc["gpus"] == 64 and doc["url"].startswith("http://127.0.0.1:") and doc["url"].endswith("/metrics")
    line = _first_line(["twin", "serve", "--gpus", "64", "--port", "0"])
    assert line.startswith("seamguard twin serve: http://127.0.0.1:") and "64 GPUs" in line


def test_progress_only_on_a_terminal(monkeypatch, capsys):
    from seamguard import clikit

    monkeypatch.setattr(clikit, "interactive", lambda: False)
    with clikit.phase("reading topo.yaml (8.6 MB)"):
        pass
    assert capsys.readouterr() == ("", "")
    monkeypatch.setattr(clikit, "interactive", lambda: True)
    with clikit.phase("reading topo.yaml (8.6 MB)"):
        print("result")
    out, err = capsys.readouterr()
    assert out == "result\n", "stdout is the command's result, never progress"
    assert err.startswith("reading topo.yaml (8.6 MB): done in ") and err.endswith(" s\n")


def test_serve_startup_json():
    pytest.importorskip("uvicorn")  # the service extra
    doc = json.loads(_first_line(["serve", "--gpus", "64", "--port", "0", "--mode", "dry_run", "-o", "json"],
                                 {"SEAMGUARD_TOKEN": "t0k"}))
    # a token given by environment is never printed (issue 35); the object names whose tokens are loaded
    assert doc["gpus"] == 64 and doc["mode"] == "dry_run" and doc["token"] is None and doc["operators"] == ["operator"]
    assert doc["dashboard"].startswith("http://127.0.0.1:") and doc["metrics"].endswith("/metrics")


# ---- errors: one line, exit 2, no traceback --------------------------------------------------


def _alias_bomb(path: Path) -> Path:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path.write_text("\n".join(lines) + "\n")
    return path


BAD_INPUTS = {
    "missing topology": (["fleet", "validate", "{tmp}/nope.yaml"], "nope.yaml: cannot read"),
    "malformed YAML": (["fleet", "validate", "{bad}"], "not valid YAML at line 2"),
    "alias bomb": (["fleet", "validate", "{bomb}"], "nested aliases"),
    "bad --mode": (["serve", "--mode", "sometimes"], "'--mode'"),
    "bad -o": (["fleet", "validate", "{bad}", "-o", "yaml"], "'--output'"),
    "flag given a value": (["demo", "--json", "true"], "unexpected extra argument"),
    "bad time": (["replay", "--prometheus", "http://127.0.0.1:9", "--topology", "{bad}", "--start",
                  "yesterday", "--end", "5", "--out", "{tmp}/r.jsonl"], "--start: cannot read time 'yesterday'"),
    "--end before --start": (["replay", "--prometheus", "http://127.0.0.1:9", "--topology", "{bad}", "--start",
                              "2025-01-31T12:00:00Z", "--end", "2025-01-31T11:00:00Z", "--out", "{tmp}/r.jsonl"],
                             "must be after --start"),
    "replay bad topology": (["replay", "--prometheus", "http://127.0.0.1:9", "--topology", "{bad}", "--start", "1",
                             "--end", "5", "--out", "{tmp}/r.jsonl"], "not valid YAML"),
    "out into a missing directory": (["fleet", "generate", "--gpus", "64", "--out", "{tmp}/no/such/t.yaml"],
                                     "--out: directory"),
    "gpus out of range": (["demo", "--gpus", "0"], "'--gpus'"),
    "unknown option": (["demo", "--gpu", "8"], "no such option"),
    "launch without a script": (["launch", "--nproc", "2"], "no training command"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, case):
    args, needle = BAD_INPUTS[case]
    bad = tmp_path / "bad.yaml"
    bad.write_text("racks: [1, 2\n")
    subs = {"tmp": str(tmp_path), "bad": str(bad), "bomb": str(_alias_bomb(tmp_path / "bomb.yaml"))}
    r = _cli(*(a.format(**subs) for a in args), timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: "), r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.stderr
    assert needle in errors[0], errors[0]
    assert "Traceback" not in r.stderr and "╭" not in r.stderr
    assert not (tmp_path / "r.jsonl").exists(), "a bad argument never creates the output file"


# ---- --help --------------------------------------------------------------------------------------


@pytest.mark.parametrize("group, commands", [
    ([], ("demo", "launch", "replay", "run", "serve", "twin", "fleet", "policy", "testbed")),
    (["twin"], ("simulate", "report", "serve")),
    (["fleet"], ("generate", "validate")),
    (["policy"], ("show", "validate")),
    (["testbed"], ("up", "down", "clean", "demo")),
])
def test_command_lists_read_whole_at_80_columns(group, commands):
    r = _invoke(*group, "--help", COLUMNS="80")
    assert r.exit_code == 0
    listing = r.stdout.split("Commands:")[1]
    assert "..." not in listing and "…" not in listing, listing  # click cuts a long summary with "..."
    for command in commands:
        assert f"\n  {command} " in listing
    assert max(len(ln) for ln in r.stdout.splitlines()) <= 80
    if not group:
        assert "--version" in r.stdout


@pytest.mark.parametrize("command, choices", [
    (["demo"], ["<table|json>"]),
    (["serve"], ["<dry_run|enforce>", "<table|json>"]),
    (["twin", "serve"], ["<default|none>", "<table|json>"]),
    (["fleet", "generate"], ["<table|json>"]),
    (["replay"], ["<table|json>"]),
    (["twin", "simulate"], ["<table|json>"]),
])
def test_help_lists_choices_and_flags_take_no_value(command, choices):
    r = _invoke(*command, "--help", COLUMNS="80")
    assert r.exit_code == 0, r.output
    for c in choices:
        assert c in r.stdout, r.stdout
    assert "<bool>" not in r.stdout  # flags are flags: `--json`, never `--json <bool>`
    json_line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("--json"))
    assert json_line.split()[1] == "Shorthand", json_line
    assert max(len(ln) for ln in r.stdout.splitlines()) <= 80
