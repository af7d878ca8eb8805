"""Decision tables for the zombie-key detector: a key judged against its own history, in simulated time."""

from __future__ import annotations

import pytest

from seamguard.gateway.zombie import ZombieDetector, ZombieThresholds

DAY = 86400.0
HOME = "10.0.0.5|python-openai"


def office_hours(det: ZombieDetector, key: str = "k", days: int = 3, hours: range = range(9, 18),
                 every_s: float = 10.0, tokens: int = 300, source: str = HOME) -> float:
    """Days of a key's ordinary traffic (one request of ``tokens`` every ``every_s`` in ``hours``); returns
    the first second after it. Any step on the way fails the test: ordinary traffic is never flagged."""
    for d in range(days):
        for h in hours:
            t = d * DAY + h * 3600.0
            while t < d * DAY + (h + 1) * 3600.0:
                assert det.observe_request(key, t, tokens, source) is None
                det.admitted(key, t, tokens)
                assert det.observe_result(key, t + 0.5, True, "fp") is None
                t += every_s
    return days * DAY + 10 * 3600.0  # the next day, mid-morning


def run(det: ZombieDetector, t0: float, seconds: float, every_s: float, tokens: int, source: str = HOME,
        ok: bool = True, fingerprint: str | None = None, key: str = "k") -> list:
    steps, t, i = [], t0, 0
    while t < t0 + seconds:
        for s in (det.observe_request(key, t, tokens, source), det.admitted(key, t, tokens),
                  det.observe_result(key, t + 0.1, ok, fingerprint or f"req{i}")):
            if s is not None:
                steps.append((round(t - t0, 1), s))
        t += every_s
        i += 1
    return steps


@pytest.mark.parametrize("every_s,tokens,source,expect", [
    (10.0, 300, HOME, None),                                  # its usual rate
    (5.0, 300, HOME, None),                                   # twice its usual: inside its own peak x 4
    (10.0, 300, "203.0.113.9|curl", None),                    # a new source at its usual volume: laptops move
    (4.0, 300, "203.0.113.9|curl", "volume from a new source"),  # 2.5x its peak, mostly from a new source
    (4.0, 300, HOME, None),                                   # the same 2.5x from home is not flagged
    (0.5, 300, HOME, "volume over its own peak"),             # 20x its peak from its usual source
    (0.5, 300, "203.0.113.9|curl", "volume from a new source"),  # 20x from a new source: the lower bar first
])
def test_volume_and_source(every_s, tokens, source, expect):
    det = ZombieDetector()
    t0 = office_hours(det)
    steps = run(det, t0, 120.0, every_s, tokens, source)
    if expect is None:
        assert steps == []
        return
    (t_throttle, first), *rest = steps
    assert (first.from_state, first.to_state, first.reason) == ("ok", "throttled", expect)
    bar = (4.0 if "peak" in expect else 1.5) * 1800
    assert t_throttle <= 60.0 * bar / (tokens * 60.0 / every_s) + every_s  # as soon as the last minute shows it
    assert first.throttle_tpm == round(1.5 * 1800)  # its own peak minute (6 x 300) with headroom
    assert first.evidence["peak_minute_tokens"] == 1800 and first.evidence["ratio"] > 1.5
    suspended = [s for _, s in rest if s.to_state == "suspended"]
    assert suspended and rest[0][0] - t_throttle >= 60.0  # still departing a minute after the throttle


def test_error_retry_loop_needs_no_history():
    det = ZombieDetector()
    steps = run(det, 0.0, 60.0, 2.0, 100, ok=False, fingerprint="same-body")
    assert steps and steps[0][1].reason == "error-retry loop"
    assert steps[0][1].evidence["identical_failures_60s"] == 20


def test_varied_failures_or_mostly_successes_are_not_a_loop():
    det = ZombieDetector()
    assert run(det, 0.0, 60.0, 2.0, 100, ok=False) == []  # 30 failures, all different requests
    det2 = ZombieDetector()
    office_hours(det2, days=1)
    t = DAY + 10 * 3600.0
    # 20 identical failures among 60 successes in the same minute: the share of failures is too low
    for i in range(80):
        assert det2.observe_result("k", t + i * 0.7, i % 4 != 0, "same-body" if i % 4 == 0 else f"r{i}") is None


def test_round_the_clock_on_a_key_that_never_had_it():
    det = ZombieDetector()
    t0 = office_hours(det, days=3, every_s=60.0)
    t0 = 3 * DAY  # midnight after three office days
    steps = run(det, t0, 22 * 3600.0, 600.0, 300)  # one small request every 10 minutes, all night
    assert steps and steps[0][1].reason == "round-the-clock traffic"
    assert steps[0][0] >= 19 * 3600.0  # judged only once 20 of the last 24 hours were active


def test_round_the_clock_key_stays_ok():
    det = ZombieDetector()
    office_hours(det, days=3, hours=range(24), every_s=120.0)
    assert run(det, 3 * DAY, 24 * 3600.0, 600.0, 300) == []


def test_no_volume_judgement_before_warmup():
    det = ZombieDetector()
    assert run(det, 0.0, 120.0, 0.5, 300) == []  # a new key's first burst: nothing to compare with


def test_quiet_throttled_key_is_released_and_baseline_did_not_learn_the_drain():
    det = ZombieDetector()
    t0 = office_hours(det)
    steps = run(det, t0, 20.0, 0.5, 300)
    assert steps[0][1].to_state == "throttled"
    assert det.baseline("k")["peak_minute_tokens"] == 1800
    t = t0 + 20.0
    assert det.tick(t + 800) == []
    (released,) = det.tick(t + 900)
    assert (released.from_state, released.to_state) == ("throttled", "ok")


def test_operator_override_holds_automatic_steps_off():
    det = ZombieDetector(ZombieThresholds(override_s=600.0))
    t0 = office_hours(det)
    steps = run(det, t0, 90.0, 0.5, 300)
    assert [s.to_state for _, s in steps] == ["throttled", "suspended"]
    step = det.override("k", t0 + 90, "ok", "operator", "new batch job, expected")
    assert (step.to_state, step.actor) == ("ok", "operator")
    assert run(det, t0 + 91, 300.0, 0.5, 300) == []
    assert det.baseline("k")["peak_minute_tokens"] == 36000  # what the operator allowed became its normal
    assert run(det, t0 + 700, 30.0, 0.05, 300)[0][1].to_state == "throttled"  # over the new normal: judged again


def test_disabled_detector_never_steps():
    det = ZombieDetector(ZombieThresholds(enabled=False))
    assert run(det, 0.0, 60.0, 1.0, 100, ok=False, fingerprint="x") == []


def test_an_unsuspend_made_on_another_replica_holds_steps_off_here_too():
    det = ZombieDetector(ZombieThresholds(override_s=600.0))
    t0 = office_hours(det)
    assert [s.to_state for _, s in run(det, t0, 90.0, 0.5, 300)] == ["throttled", "suspended"]
    det.adopt("k", "ok", None, t0 + 95, operator_at=t0 + 92)  # read from the shared store
    assert run(det, t0 + 96, 200.0, 0.5, 300) == []


def test_a_refused_request_does_not_teach_the_peak():
    """Only admitted work is learned: one impossible request (max_tokens of 10 million, refused)
    lifted a new key's peak minute to 10 M, which switched the volume rule off for a week."""
    det = ZombieDetector()
    det.observe_request("k", 0.0, 10_000_000, HOME)          # refused by the budget: no `admitted`
    t = 1.0
    for _ in range(3 * 6):                                     # three ordinary minutes after it
        det.observe_request("k", t, 300, HOME)
        det.admitted("k", t, 300)
        t += 10.0
    det.observe_request("k", 4 * 60.0 + 3600.0, 300, HOME)     # rolls the settled minutes in
    assert det.baseline("k")["peak_minute_tokens"] == 1800.0   # six requests of 300 in a minute
