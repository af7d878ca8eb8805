"""Fleet histories for evaluation, independent of the detector (issue 15).

A generator of scrape-level histories for synthetic fleets — per-GPU hardware spread,
everyday events that are not faults, and injected faults of many classes — written as
OpenMetrics with the real exporters' names and labels, plus the labels file of the
injected incidents. Its physics and noise share no code or constants with
``seamguard.assess``, ``seamguard.decide`` or the twin (an import-linter contract holds
this); it reads only the fleet model and, from ``seamguard.observe``, series names.
"""

from seamguard.scenarios.faults import CLASSES, FAULT_CLASS_NAMES
from seamguard.scenarios.generator import Scenario, ScenarioSpec, rotating_classes, scenario_fleet
from seamguard.scenarios.labels import write_labels
from seamguard.scenarios.openmetrics import OpenMetricsWriter
from seamguard.scenarios.writeout import GeneratedScenario, generate_files

__all__ = ["CLASSES", "FAULT_CLASS_NAMES", "GeneratedScenario", "OpenMetricsWriter", "Scenario", "ScenarioSpec",
           "generate_files", "rotating_classes", "scenario_fleet", "write_labels"]
