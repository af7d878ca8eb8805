"""Heartbeat judgement with an injected clock: unresponsive, stalled, straggler."""

from seamguard.runtime.detect import Beat, HeartbeatTracker


def tracker(**kw):
    return HeartbeatTracker(**{"hang_timeout_s": 1.0, "stall_timeout_s": 5.0,
                               "straggler_factor": 1.5, "straggler_window": 3, **kw})


def test_frozen_counter_is_unresponsive_only_after_timeout():
    t = tracker()
    for w in (0, 1):
        t.observe(w, Beat(1, 5, "compute", 0.1), 0.0)
    t.observe(0, Beat(9, 6, "compute", 0.1), 0.9)
    assert t.verdicts([0, 1], 0.9) == []
    t.observe(0, Beat(12, 6, "compute", 0.1), 1.5)
    v = t.verdicts([0, 1], 1.5)
    assert [(x.wid, x.kind) for x in v] == [(1, "unresponsive")]


def test_stuck_main_thread_while_peers_wait_is_stalled():
    t = tracker()
    for now in range(0, 8):
        t.observe(0, Beat(now, 5, "compute", 0.1), float(now))
        t.observe(1, Beat(now, 6, "collective", 0.1), float(now))
        t.observe(2, Beat(now, 6, "collective", 0.1), float(now))
    kinds = {(v.wid, v.kind) for v in t.verdicts([0, 1, 2], 7.0)}
    assert kinds == {(0, "stalled")}


def test_persistent_straggler_needs_a_window_of_slow_steps():
    t = tracker()
    verdicts = []
    for step in range(5):
        for w in (0, 1, 2):
            t.observe(w, Beat(step, step, "collective", 0.5 if w == 2 else 0.1), float(step))
        verdicts.append({(v.wid, v.kind) for v in t.verdicts([0, 1, 2], float(step))})
    assert verdicts[1] == set() and (2, "straggler") in verdicts[2]


def test_one_slow_step_is_not_a_straggler():
    t = tracker()
    for step in range(6):
        for w in (0, 1, 2):
            slow = w == 2 and step == 2
            t.observe(w, Beat(step, step, "compute", 0.5 if slow else 0.1), float(step))
        assert not [v for v in t.verdicts([0, 1, 2], float(step)) if v.kind == "straggler"]
