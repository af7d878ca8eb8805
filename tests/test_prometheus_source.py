"""PrometheusSource against real HTTP: label mapping, and every failure the issue lists.

The failures come from a small local HTTP server that answers what a broken proxy or
an overloaded Prometheus would (a real Prometheus cannot be made to send them on cue);
the happy path is covered against a real Prometheus in test_prom_integration.py.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from seamguard.fleet.generate import FleetShape, generate_fleet
from seamguard.observe.prometheus import PromConfig, PrometheusSource

FLEET = generate_fleet(FleetShape(gpus=16), seed=0)  # gpu000, gpu001


def vector(samples):
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [1700000000.0, v]} for m, v in samples]}}


class Server:
    """Answers each query with routes[query] = (status, body-bytes, delay)."""

    def __init__(self):
        self.routes: dict[str, tuple[int, bytes, float]] = {}
        self.headers: list[dict] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                from urllib.parse import parse_qs
                q = parse_qs(self.rfile.read(n).decode())["query"][0]
                outer.headers.append(dict(self.headers) | {"path": self.path})
                status, body, delay = outer.routes.get(q, (200, json.dumps(vector([])).encode(), 0.0))
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def source(server, **kw):
    return PrometheusSource(FLEET, PromConfig(url=server.url, retries=0, **kw))


def test_maps_both_dcgm_host_labels_and_instance_nics(server):
    server.routes["DCGM_FI_DEV_GPU_TEMP"] = (200, json.dumps(vector([
        ({"Hostname": "gpu000", "gpu": "3"}, "61.5"),
        ({"hostname": "gpu001.cluster.local", "gpu": "0"}, "70"),  # newer dcgm-exporter, FQDN
        ({"hostname": "gpu999", "gpu": "0"}, "50"),  # not in the fleet
    ])).encode(), 0.0)
    server.routes["node_infiniband_state_id"] = (200, json.dumps(vector([
        ({"instance": "gpu001:9100", "device": "mlx5_2", "port": "1"}, "4"),
        ({"node": "gpu000", "device": "mlx5_7", "port": "1"}, "1"),
    ])).encode(), 0.0)
    with source(server) as src:
        f = src.frame_at(1700000000.0)
    temp = f.values["DCGM_FI_DEV_GPU_TEMP"]
    assert temp[FLEET.gpu_names.index("gpu000/gpu3")] == 61.5
    assert temp[FLEET.gpu_names.index("gpu001/gpu0")] == 70.0
    assert np.isnan(temp).sum() == 14  # GPUs that did not report are missing, not zero
    st = f.values["node_infiniband_state_id"]
    assert st[FLEET.nic_names.index("gpu001/mlx5_2")] == 4 and st[FLEET.nic_names.index("gpu000/mlx5_7")] == 1
    assert any("1 series for entities not in the fleet" in x for x in f.flags)


@pytest.mark.parametrize("status,body,expect", [
    (200, b"<html>gateway</html>", "not JSON"),
    (422, json.dumps({"status": "error", "errorType": "execution", "error": "too many samples"}).encode(),
     "HTTP 422, execution: too many samples"),
    (503, b"upstream unavailable", "retryable"),
    (400, json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode(), "permanent"),
    (200, json.dumps({"status": "success"}).encode(), "no data.result"),
])
def test_failed_queries_are_flagged_and_the_tick_proceeds(server, status, body, expect, caplog):
    server.routes["DCGM_FI_DEV_GPU_TEMP"] = (status, body, 0.0)
    server.routes["DCGM_FI_DEV_SM_CLOCK"] = (200, json.dumps(vector([
        ({"Hostname": "gpu000", "gpu": "0"}, "1980")])).encode(), 0.0)
    with source(server) as src:
        f = src.frame_at()
    bad = [x for x in f.flags if x.startswith("prometheus:DCGM_FI_DEV_GPU_TEMP:")]
    assert len(bad) == 1 and expect in bad[0], f.flags
    assert "DCGM_FI_DEV_GPU_TEMP" not in f.values and np.isnan(f.get("DCGM_FI_DEV_GPU_TEMP")).all()
    assert f.values["DCGM_FI_DEV_SM_CLOCK"][0] == 1980.0  # the rest of the tick is intact
    assert any("DCGM_FI_DEV_GPU_TEMP" in r.message for r in caplog.records if r.levelname == "ERROR")


def test_timeout_is_retryable_and_bounded(server):
    server.routes["DCGM_FI_DEV_GPU_TEMP"] = (200, json.dumps(vector([])).encode(), 2.0)
    with source(server, timeout_s=0.3) as src:
        f = src.frame_at()
    assert any(x.startswith("prometheus:DCGM_FI_DEV_GPU_TEMP:retryable: timeout") for x in f.flags), f.flags


def test_nan_inf_and_garbage_samples_become_missing(server):
    server.routes["DCGM_FI_DEV_POWER_USAGE"] = (200, json.dumps(vector([
        ({"Hostname": "gpu000", "gpu": "0"}, "NaN"), ({"Hostname": "gpu000", "gpu": "1"}, "+Inf"),
        ({"Hostname": "gpu000", "gpu": "2"}, "abc"), ({"Hostname": "gpu000", "gpu": "3"}, "300.5")])).encode(), 0.0)
    with source(server) as src:
        f = src.frame_at()
    p = f.values["DCGM_FI_DEV_POWER_USAGE"]
    assert np.isnan(p[:3]).all() and p[3] == 300.5
    assert any("3 NaN/Inf/unparsable samples dropped" in x for x in f.flags)


def test_tenant_token_and_path_prefix_reach_the_server(server, tmp_path):
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    with source(server, path_prefix="/prometheus", tenant="team-a", bearer_token_file=tok) as src:
        src.frame_at()
    h = server.headers[0]
    assert h["path"] == "/prometheus/api/v1/query"
    assert h["X-Scope-OrgID"] == "team-a" and h["Authorization"] == "Bearer s3cret"


def test_config_errors_name_the_field(tmp_path):
    from seamguard.app.config import ConfigError, load_run_config

    p = tmp_path / "run.yaml"
    p.write_text("version: 1\ntopology: t.yaml\nprometheus: {url: 'ftp://x', timeout_s: -1}\n"
                 "actuators: [{type: slurm, timeout_s: 0}]\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(p)
    msg = str(e.value)
    assert str(p) in msg and "prometheus.timeout_s" in msg and "actuators[0].slurm.timeout_s" in msg
    p.write_text("version: 1\ntopology: t.yaml\nprometheus: {url: 'http://x', mapping: {signals: {NOPE: {}}}}\n")
    with pytest.raises(ConfigError, match="unknown signal 'NOPE'"):
        load_run_config(p)


def test_schema_violations_are_permanent_and_name_the_field(server):
    server.routes["DCGM_FI_DEV_GPU_TEMP"] = (200, json.dumps({"status": "success", "data": {
        "resultType": "vector", "result": {"not": "a list"}}}).encode(), 0.0)
    server.routes["DCGM_FI_DEV_SM_CLOCK"] = (200, json.dumps({"status": "maybe"}).encode(), 0.0)
    with source(server) as src:
        f = src.frame_at()
    temp = [x for x in f.flags if x.startswith("prometheus:DCGM_FI_DEV_GPU_TEMP:")]
    clock = [x for x in f.flags if x.startswith("prometheus:DCGM_FI_DEV_SM_CLOCK:")]
    assert temp and "permanent" in temp[0] and "data.result" in temp[0]
    assert clock and "permanent" in clock[0] and "status" in clock[0]


def test_numbers_for_values_are_read_but_objects_are_dropped(server):
    server.routes["DCGM_FI_DEV_GPU_TEMP"] = (200, json.dumps({"status": "success", "data": {
        "resultType": "vector", "result": [
            {"metric": {"Hostname": "gpu000", "gpu": "0"}, "value": [1.0, 61]},
            {"metric": {"Hostname": "gpu000", "gpu": "1"}, "value": [1.0, {"v": 1}]},
            {"metric": {"Hostname": ["gpu000"], "gpu": "2"}, "value": [1.0, "1"]},
            {"metric": {"Hostname": "gpu000", "gpu": "3"}, "value": [1.0, "62", "extra"]},
        ]}}).encode(), 0.0)
    with source(server) as src:
        f = src.frame_at()
    t = f.values["DCGM_FI_DEV_GPU_TEMP"]
    assert t[0] == 61.0 and np.isnan(t[1:4]).all()
    assert any("3 malformed series dropped" in x for x in f.flags), f.flags


def test_deadline_and_size_bounds_are_config_fields(tmp_path):
    from seamguard.app.config import ConfigError, load_run_config

    p = tmp_path / "run.yaml"
    p.write_text("version: 1\ntopology: t.yaml\nprometheus: {url: 'http://x', deadline_s: 0, "
                 "max_response_bytes: 10}\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(p)
    assert "prometheus.deadline_s" in str(e.value) and "prometheus.max_response_bytes" in str(e.value)
