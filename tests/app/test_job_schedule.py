"""The run config's per-job schedule (app/config.py ``jobs``): deadlines, steps, step time -> the fleet.

A deadline is an ISO 8601 time with a timezone, quoted or as YAML's own timestamp; anything
else is a one-line error naming the file, the job and the field.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest
import yaml

from seamguard.app.config import ConfigError, load_run_config, with_job_schedule
from seamguard.fleet import FleetShape, generate_fleet
from seamguard.fleet.topology import fleet_to_topology

TOPO = generate_fleet(FleetShape(gpus=128, racks_per_loop=2), seed=3)
J0, J1 = TOPO.job_names[:2]


def _write(tmp_path, jobs_yaml: str):
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet_to_topology(TOPO)))
    (tmp_path / "run.yaml").write_text("version: 1\ntopology: fleet.yaml\nprometheus: {url: 'http://127.0.0.1:9'}\n"
                                       + jobs_yaml)
    return tmp_path / "run.yaml"


@pytest.mark.parametrize("value", ["'2027-01-15T08:00:00Z'", "2027-01-15T08:00:00Z", "2027-01-15 10:00:00+02:00",
                                   "'2027-01-15T10:00:00+02:00'"])
def test_a_deadline_quoted_or_as_a_yaml_timestamp(tmp_path, value):
    cfg = load_run_config(_write(tmp_path, f"jobs:\n  {J0}: {{deadline: {value}, total_steps: 5000, step_s: 2.5}}\n"))
    fleet = with_job_schedule(TOPO, cfg.jobs)
    deadline, total, step = fleet.job_schedule()
    assert deadline[0] == datetime(2027, 1, 15, 8, tzinfo=timezone.utc).timestamp()
    assert total[0] == 5000 and step[0] == 2.5
    assert np.isnan(deadline[1:]).all() and np.isnan(total[1:]).all()


@pytest.mark.parametrize("value, why", [
    ("'2027-01-15T08:00:00'", "has no timezone"),
    ("2027-01-15T08:00:00", "has no timezone"),     # YAML's naive timestamp
    ("'next tuesday'", "is not an ISO 8601 time"),
    ("1700000000", "is not an ISO 8601 time with a timezone"),
])
def test_a_bad_deadline_is_one_line_naming_the_job_and_field(tmp_path, value, why):
    path = _write(tmp_path, f"jobs:\n  {J1}: {{deadline: {value}}}\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: jobs.{J1}.deadline: ") and why in msg


def test_other_bad_job_fields_and_unknown_jobs_are_named(tmp_path):
    with pytest.raises(ConfigError, match=rf"jobs\.{J0}\.total_steps"):
        load_run_config(_write(tmp_path, f"jobs:\n  {J0}: {{total_steps: -3}}\n"))
    cfg = load_run_config(_write(tmp_path, "jobs:\n  nobody: {step_s: 1.0}\n"))
    with pytest.raises(ConfigError, match=r"jobs\.nobody: no job of that name in the topology"):
        with_job_schedule(TOPO, cfg.jobs)


def test_the_live_source_carries_the_schedule(tmp_path):
    from seamguard.app.sources import PrometheusLiveSource

    src = PrometheusLiveSource(load_run_config(_write(
        tmp_path, f"jobs:\n  {J1}: {{deadline: '2027-01-15T08:00:00Z', total_steps: 100}}\n")))
    try:
        deadline, total, step = src.placement().job_schedule()
    finally:
        src.close()
    assert deadline[1] == datetime(2027, 1, 15, 8, tzinfo=timezone.utc).timestamp() and total[1] == 100
    assert np.isnan(step[1])
