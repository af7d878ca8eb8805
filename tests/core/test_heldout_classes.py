"""The held-out fault classes are accounted for where their figures are used.

benchmarks/detection.py reports which held-out classes no named channel reads
(`classes_without_channel`), from the channels it names per class; those channels must be
the detector's own. The event twin draws its detection of each event kind from the
measured classes behind it (`TWIN_EVENT_CLASSES`); every held-out class stands for one.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from seamguard.assess import assess, initial_states
from seamguard.decide import default_policy
from seamguard.fleet import FleetShape, generate_fleet
from seamguard.observe import History
from seamguard.scenarios.faults import HELDOUT_ONLY
from seamguard.twin.events.detection import TWIN_EVENT_CLASSES
from seamguard.twin.telemetry import Twin, TwinConfig

ROOT = Path(__file__).resolve().parents[2]


def _benchmark():
    spec = importlib.util.spec_from_file_location("detection_benchmark", ROOT / "benchmarks" / "detection.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _detector_channels() -> set[str]:
    fleet = generate_fleet(FleetShape(gpus=16), seed=1)
    pol = default_policy()
    hist = History(30.0, 2, pol.assess.history_depths(30.0))
    a = assess(fleet, Twin(fleet, [], TwinConfig(tick_s=30.0), seed=1).step(), hist, initial_states(fleet), pol.assess)
    return {c for k in a.kinds.values() for c in k.evidence.channels}


def test_classes_without_channel_follow_the_detectors_channels():
    bench = _benchmark()
    channels = _detector_channels()
    for cls, named in bench.HELDOUT_CHANNELS.items():
        assert cls in HELDOUT_ONLY, cls
        assert set(named) <= channels, f"{cls}: {sorted(set(named) - channels)} are no channels of the detector"
    assert bench.HELDOUT_CHANNELS["nvswitch_sxid"], "nvswitch_sxid has the nvswitch channels"


def test_every_heldout_class_stands_for_a_twin_event():
    named = {n for ns in TWIN_EVENT_CLASSES.values() for n in ns}
    assert set(HELDOUT_ONLY) <= named, sorted(set(HELDOUT_ONLY) - named)
    assert "nvswitch_sxid" in TWIN_EVENT_CLASSES["precursor"]
