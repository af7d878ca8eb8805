"""One call from a spec to the files: OpenMetrics history, topology, labels, truth."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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


Sink = Callable[[float, dict[str, np.ndarray], list[str]], None]


def generate_files(spec: ScenarioSpec, out_dir: Path, also: Sink | None = None) -> GeneratedScenario:
    """Write ``history.om``, ``topology.yaml``, ``labels.yaml`` and ``truth.json`` under ``out_dir``;
    ``also`` sees every scrape too (a second reader of the same history, e.g. another detector)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sc = Scenario(spec)
    writer = OpenMetricsWriter(out_dir / "history.om", sc.fleet)
    if also is None:
        sc.run(writer)
    else:
        def both(t: float, values: dict[str, np.ndarray], driver: list[str]) -> None:
            writer(t, values, driver)
            also(t, values, driver)

        sc.run(both)
    writer.close()
    topo = out_dir / "topology.yaml"
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    topo.write_text(yaml.dump(fleet_to_topology(sc.fleet), Dumper=dumper, sort_keys=False), encoding="utf-8")
    incidents = sc.labels()
    labels = write_labels(out_dir / "labels.yaml", incidents,
                          source=f"seamguard scenarios generate --gpus {spec.gpus} --seed {spec.seed}"
                                 f" (physics {spec.physics})")
    truth = out_dir / "truth.json"
    truth.write_text(json.dumps(sc.truth(), indent=1) + "\n", encoding="utf-8")
    return GeneratedScenario(out_dir / "history.om", topo, labels, truth, spec.start_unix,
                             spec.start_unix + sc.window_s, spec.scrape_s, writer.samples, incidents)
