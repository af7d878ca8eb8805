"""Shared fixtures for the event-twin tests."""

from dataclasses import replace

import pytest

from seamguard.twin.events.calibration import llama3_failure_model


@pytest.fixture
def quiet_model():
    """Only hard failures (at a negligible rate) — no fail-slows, flaps, cooling, maintenance."""
    return replace(llama3_failure_model().with_rf(1e-12), planned_per_node_day=0.0,
                   fail_slow_per_node_day=0.0, flap_per_link_day=0.0,
                   cooling_event_per_loop_day=0.0)
