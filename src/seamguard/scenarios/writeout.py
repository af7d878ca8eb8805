"""One call from a spec to the files: OpenMetrics history, topology, labels, truth."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from seamguard.fleet import fleet_to_topology
from seamguard.scenarios.generator import Scenario, ScenarioSpec
from seamguard.scenarios.labels import write_labels
from seamguard.scenarios.openmetrics import OpenMetricsWriter


@dataclass(frozen=True)
class GeneratedScenario:
    openmetrics: Path
    topology: Path
    labels: Path
    truth: Path
    start: float
    end: float
    scrape_s: float
    samples: int
    incidents: list[dict]


def generate_files(spec: ScenarioSpec, out_dir: Path) -> GeneratedScenario:
    """Write ``history.om``, ``topology.yaml``, ``labels.yaml`` and ``truth.json`` under ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sc = Scenario(spec)
    writer = OpenMetricsWriter(out_dir / "history.om", sc.fleet)
    sc.run(writer)
    writer.close()
    topo = out_dir / "topology.yaml"
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    topo.write_text(yaml.dump(fleet_to_topology(sc.fleet), Dumper=dumper, sort_keys=False), encoding="utf-8")
    incidents = sc.labels()
    labels = write_labels(out_dir / "labels.yaml", incidents,
                          source=f"seamguard scenarios generate --gpus {spec.gpus} --seed {spec.seed}")
    truth = out_dir / "truth.json"
    truth.write_text(json.dumps(sc.truth(), indent=1) + "\n", encoding="utf-8")
    return GeneratedScenario(out_dir / "history.om", topo, labels, truth, spec.start_unix,
                             spec.start_unix + sc.window_s, spec.scrape_s, writer.samples, incidents)
