"""The coordinator's decisions, driven through an in-memory store and an injected clock."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from seamguard.decide.tiers import daly_interval_s
from seamguard import hintauth
from seamguard.runtime import cadence, keys
from seamguard.runtime.coordinator import Coordinator
from seamguard.runtime.settings import LaunchSettings
from tests.runtime.coordinator_helpers import run_first_generation


class DictStore:
    def __init__(self):
        self.d: dict[str, bytes] = {}

    def check(self, ks):
        return all(k in self.d for k in ks)

    def get(self, k):
        return self.d[k]

    def set(self, k, v):
        self.d[k] = v.encode() if isinstance(v, str) else v

    def add(self, k, n):
        v = int(self.d.get(k, b"0")) + n
        self.d[k] = str(v).encode()
        return v


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(trainers=(0, 1), spares=(2,), ckpt=None):
    store, clock, log = DictStore(), Clock(), []
    c = Coordinator(store, LaunchSettings(script=["x.py"], nproc=len(trainers)), list(trainers),
                    list(spares), ckpt, 30.0, log.append, clock=clock)
    return c, store, clock, log


def beat(store, wid, n, step, phase="compute"):
    store.set(keys.heartbeat(wid), json.dumps({"n": n, "step": step, "phase": phase,
                                               "compute_s": 0.1, "gen": 0}))


def finish_generation(c, store, steps):
    gen = c.plan.gen
    for w in c.plan.ranks:
        store.set(keys.have(gen, w), json.dumps({"own": steps.get(w, []),
                                                  "replicas": {"1": steps.get("r", [])}}))
    c.tick()
    resume = json.loads(store.get(keys.resume(gen)))
    for w in c.plan.ranks:
        store.set(keys.recovered(gen, w), json.dumps({"ok": True, "checksum": "ab", "step": resume["step"]}))
    c.tick()
    return resume


def test_start_kill_replace_and_finish():
    c, store, clock, log = make()
    for w in (0, 1, 2):
        store.set(keys.worker_addr(w), "h:1")
    c.tick()
    assert c.plan.gen == 0 and store.get(keys.GENERATION) == b"0"
    assert finish_generation(c, store, {}) == {"source": "fresh", "step": 0}
    assert c.phase == "running"
    store.set(keys.exit_code(1), "-9")
    c.tick()
    assert c.plan.gen == 1 and c.plan.ranks == [0, 2] and c.plan.holders == {1: 0}
    resume = finish_generation(c, store, {0: [6, 7, 8], "r": [7, 8]})
    assert resume == {"source": "memory", "step": 8}
    for w in (0, 2):
        store.set(keys.done(w), "20")
    assert c.tick() == "done" and store.get(keys.JOB_DONE) == b"ok"


def test_steps_redone_count_where_the_members_stood_not_only_their_last_heartbeat():
    """Heartbeats lag (one every 0.2 s, many short steps in between): the steps a recovery
    redoes are counted from the step each member reports with its holdings."""
    c, store, clock, log = make()
    for w in (0, 1, 2):
        store.set(keys.worker_addr(w), "h:1")
    c.tick()
    finish_generation(c, store, {})
    beat(store, 0, 1, 5)   # the last beats said step 5 ...
    beat(store, 1, 1, 5)
    c.tick()
    store.set(keys.exit_code(1), "-9")
    c.tick()
    gen = c.plan.gen
    store.set(keys.have(gen, 0), json.dumps({"step": 8, "own": [6, 7], "replicas": {"1": [7]}}))   # ... it was at 8
    store.set(keys.have(gen, 2), json.dumps({"step": 0, "own": [], "replicas": {}}))
    c.tick()
    for w in c.plan.ranks:
        store.set(keys.recovered(gen, w), json.dumps({"ok": True, "checksum": "ab", "step": 7}))
    c.tick()
    resumed = [e for e in log if e["event"] == "resumed" and e["gen"] == gen]
    assert resumed and resumed[0]["steps_redone"] == 1


def test_frozen_heartbeat_is_evicted_and_failed_recovery_goes_to_disk(tmp_path):
    c, store, clock, log = make(ckpt=tmp_path)
    for w in (0, 1, 2):
        store.set(keys.worker_addr(w), "h:1")
    c.tick()
    finish_generation(c, store, {})
    for n in range(30):
        clock.t = n * 0.1
        beat(store, 0, n, n)
        beat(store, 1, min(n, 5), 5)  # frozen after 0.5 s
        c.tick()
    assert store.check([keys.kill_request(1)])
    assert any(e["event"] == "detected" and e["kind"] == "unresponsive" for e in log)
    assert c.plan.gen == 1
    gen = c.plan.gen
    for w in c.plan.ranks:
        store.set(keys.have(gen, w), json.dumps({"own": [5], "replicas": {"1": [5]}}))
    c.tick()
    store.set(keys.recovered(gen, 0), json.dumps({"ok": True, "checksum": "a", "step": 5}))
    store.set(keys.recovered(gen, 2), json.dumps({"ok": False, "error": "hash mismatch"}))
    c.tick()
    assert c.plan.gen == 2 and c.plan.force_disk
    # no verified checkpoint exists: the job fails loudly instead of continuing torn
    for w in c.plan.ranks:
        store.set(keys.have(2, w), json.dumps({"own": [5]}))
    assert c.tick() == "failed" and store.get(keys.JOB_DONE) == b"failed"


def test_evacuate_hint_and_checkpoint_hint():
    c, store, clock, log = make()
    for w in (0, 1, 2):
        store.set(keys.worker_addr(w), "h:1")
    c.tick()
    finish_generation(c, store, {})
    beat(store, 0, 1, 40)
    beat(store, 1, 1, 40)
    hintauth.send(store, keys.HINT_CHECKPOINT_REQ, "now", c.hint_key, keys.HINT_CHECKPOINT)
    hintauth.send(store, keys.HINT_EVACUATE, "0", c.hint_key)
    c.tick()
    assert int(store.get(keys.HINT_PERSIST_AT)) > 40
    assert store.check([keys.kill_request(0)]) and c.plan.ranks == [2, 1]


def test_checkpoint_hint_waits_for_the_jobs_pace():
    """A hint that comes before any beat reports a step's time is held (not set some fixed
    number of steps out): once the ranks beat with a pace, it lands a few steps ahead."""
    c, store, clock, log = make()
    for w in (0, 1, 2):
        store.set(keys.worker_addr(w), "h:1")
    c.tick()
    finish_generation(c, store, {})
    for w in (0, 1):
        store.set(keys.heartbeat(w), json.dumps({"n": 1, "step": 0, "phase": "compute", "compute_s": 0.0, "gen": 0}))
    hintauth.send(store, keys.HINT_CHECKPOINT_REQ, "now", c.hint_key, keys.HINT_CHECKPOINT)
    c.tick()
    assert not store.check([keys.HINT_PERSIST_AT])
    beat(store, 0, 2, 4)
    beat(store, 1, 2, 5)
    clock.t += 0.2
    c.tick()
    target = int(store.get(keys.HINT_PERSIST_AT))
    assert 5 < target <= 5 + 10
    store.add(keys.HINT_CHECKPOINT, 0)   # the same hint read again is not a new one
    beat(store, 0, 3, 9)
    c.tick()
    assert int(store.get(keys.HINT_PERSIST_AT)) == target


def _rank_1_lost_with_a_replacement_starting():
    c, store, clock, log = make(spares=())
    for w in (0, 1):
        store.set(keys.worker_addr(w), "h:1")
    c.tick()
    finish_generation(c, store, {})
    # rank 1 dies; its launcher has started a replacement (wid 2) that is not ready yet
    store.set(keys.exit_code(1), "-9")
    store.set(keys.JOINED_COUNT, "1")
    store.set(keys.joined(1), "2")
    c.tick()
    return c, store, clock, log


def test_loss_without_ready_spare_waits_for_the_replacement_then_replaces():
    c, store, clock, log = _rank_1_lost_with_a_replacement_starting()
    assert c.plan.gen == 0 and log[-1]["event"] == "waiting_for_spares"
    clock.t += 5.0
    store.set(keys.ready(2), "1")
    c.tick()   # the replacement is ready: replaced, no shrink
    assert c.plan.gen == 1 and c.plan.ranks == [0, 2] and c.plan.roles == [0, 1]


def test_replacement_that_never_gets_ready_ends_in_a_shrink():
    c, store, clock, log = _rank_1_lost_with_a_replacement_starting()
    clock.t += c.settings.spare_wait_s + 1
    c.tick()
    assert c.plan.gen == 1 and c.plan.ranks == [0]


def test_the_only_rank_lost_before_its_replacement_starts_waits_instead_of_failing():
    """A rank judged unresponsive while its process is still exiting (on an H100, 19 GB of
    pinned memory took over a second to free): no replacement is starting yet and no rank is
    left. Failing the job was the old answer; it waits (bounded) for the replacement its
    launcher starts once the process is gone."""
    c, store, clock, log = make(trainers=(0,), spares=())
    store.set(keys.worker_addr(0), "h:1")
    c.tick()
    finish_generation(c, store, {})
    for n in range(15):
        clock.t = n * 0.1
        beat(store, 0, 1, 5)            # frozen: judged unresponsive after hang_timeout_s
        c.tick()
    assert c.phase != "failed" and any(e["event"] == "waiting_for_spares" for e in log), log[-3:]
    store.set(keys.JOINED_COUNT, "1")   # the launcher saw the exit and started w1
    store.set(keys.joined(1), "1")
    c.tick()
    store.set(keys.ready(1), "1")
    clock.t += 2.0
    c.tick()
    assert c.plan.gen == 1 and c.plan.ranks == [1]


def test_the_only_rank_lost_with_nothing_coming_fails_after_the_wait():
    c, store, clock, log = make(trainers=(0,), spares=())
    store.set(keys.worker_addr(0), "h:1")
    c.tick()
    finish_generation(c, store, {})
    store.set(keys.exit_code(0), "-9")
    c.tick()
    assert c.phase != "failed"
    clock.t += c.settings.spare_wait_s + 1
    assert c.tick() == "failed"


def _two_nodes():
    """Two nodes, one rank and one spare each (w0 rank, w1 spare; w2 rank, w3 spare)."""
    store, clock, log = DictStore(), Clock(), []
    s = LaunchSettings(script=["x.py"], nproc=1, spares=1, nnodes=2, master_port=29500)
    c = Coordinator(store, s, [0, 2], [1, 3], None, 30.0, log.append, clock=clock)
    for w in range(4):
        store.set(keys.worker_addr(w), f"10.0.0.{w // 2}:1")
    c.tick()
    for node in (0, 1):
        store.set(keys.node_beats(node), json.dumps({"n": 1, "beats": {
            str(w): {"n": 1, "step": 3, "phase": "compute", "compute_s": 0.1} for w in (2 * node, 2 * node + 1)}}))
    finish_generation(c, store, {})
    assert c.phase == "running"
    return c, store, clock, log


def test_a_node_whose_link_closed_is_lost_at_once_with_all_its_workers():
    c, store, clock, log = _two_nodes()
    c.tick(links_closed=((1, "closed by the node"),))   # no time passed: no record is stale
    lost = [e for e in log if e["event"] == "node_lost"]
    assert [(e["node"], e["wids"]) for e in lost] == [(1, [2, 3])]
    assert "link" in lost[0]["evidence"]
    assert c.plan.gen == 1 and c.plan.ranks == [0, 1]   # node 0's spare took rank 1
    assert store.check([keys.kill_request(2), keys.kill_request(3)])
    clock.t += 5.0   # its record stays silent: the same node is not judged lost again
    store.set(keys.node_beats(0), json.dumps({"n": 2, "beats": {"0": {"n": 2, "step": 4, "phase": "compute",
                                                                     "compute_s": 0.1}}}))
    c.tick()
    assert [e["node"] for e in log if e["event"] == "node_lost"] == [1]


def _beat_nodes(c, store, clock, seconds: float, nodes=(0,), pass_s: float = 0.05) -> None:
    """Run the coordinator's passes every ``pass_s`` for ``seconds``, the launchers of
    ``nodes`` writing their records (their workers beating) before each pass."""
    for _ in range(round(seconds / pass_s)):
        clock.t += pass_s
        for node in nodes:
            rec = json.loads(store.get(keys.node_beats(node)))
            n = rec["n"] + 1
            store.set(keys.node_beats(node), json.dumps({"n": n, "beats": {
                w: {**hb, "n": n} for w, hb in rec["beats"].items()}}))
        c.tick()


def _lost_nodes(log) -> list[int]:
    return [e["node"] for e in log if e["event"] == "node_lost"]


def test_without_a_link_closing_a_node_is_lost_only_when_its_record_stands_still():
    c, store, clock, log = _two_nodes()
    _beat_nodes(c, store, clock, 0.5, nodes=(0, 1))
    _beat_nodes(c, store, clock, 0.9)      # node 1's record stands still for 0.9 s
    assert not _lost_nodes(log)
    _beat_nodes(c, store, clock, 0.2)      # ... and then 1.1 s > hang_timeout_s (1 s)
    lost = [e for e in log if e["event"] == "node_lost"]
    assert [e["node"] for e in lost] == [1] and "silent" in lost[0]["evidence"]
    assert c.plan.ranks == [0, 1]          # node 0's spare took the rank


def test_the_coordinators_own_node_is_not_judged_by_its_record():
    # node 0's record is written by the coordinator's own process: late there means the
    # coordinator was late (were node 0 gone, the coordinator would be gone with it)
    c, store, clock, log = _two_nodes()
    _beat_nodes(c, store, clock, 1.5, nodes=(1,))
    assert 0 not in _lost_nodes(log)


def test_a_pause_of_the_coordinator_itself_is_nobodys_silence():
    # the launcher got no CPU for 1.9 s (load 20 on 2 cores): nothing could be observed,
    # so neither node 1 nor any worker is judged on that gap
    c, store, clock, log = _two_nodes()
    _beat_nodes(c, store, clock, 0.3, nodes=(0, 1))
    clock.t += 1.9
    c.tick()
    assert not _lost_nodes(log) and not [e for e in log if e["event"] == "detected"]
    assert c.plan.gen == 0
    # a node that really stopped is still found once the coordinator runs again
    _beat_nodes(c, store, clock, 1.1)
    assert _lost_nodes(log) == [1]


def test_a_node_launcher_gone_before_the_start_ends_the_launch():
    store, clock, log = DictStore(), Clock(), []
    s = LaunchSettings(script=["x.py"], nproc=1, nnodes=2, master_port=29500)
    c = Coordinator(store, s, [0, 1], [], None, 30.0, log.append, clock=clock)
    assert c.tick(links_closed=((1, "ECONNRESET"),)) == "failed"
    assert "node 1's launcher went away (ECONNRESET)" in log[-1]["reason"]


@pytest.mark.parametrize("nnodes, compute_s, margin", [
    (1, 0.1, 3 + 7),    # 0.5 s of reports' lag + a heartbeat's reading (0.2 s) = 0.7 s = 7 steps
    (2, 0.1, 3 + 10),   # aggregated: + a node beat (0.25 s) on the reading: 0.95 s
    (1, 0.6, 3 + 2),
    (2, 0.6, 3 + 2),
    (2, 0.0, None),     # no step measured yet: the change waits for one
])
def test_a_control_change_starts_beyond_what_any_rank_may_not_have_read(nnodes, compute_s, margin):
    """A rank relies on a reading of the control counter up to a heartbeat (and, through
    its node's mirror, a node beat) old (Runtime._controls), and the coordinator sees the
    ranks' steps that late: a change starts far enough ahead for both."""
    c, store, clock, log = make()
    c.settings = replace(c.settings, nnodes=nnodes, master_port=29500)
    c.plan = SimpleNamespace(ranks=[0, 1])
    c._read_beats = lambda ranks: {0: {"step": 40, "compute_s": compute_s}, 1: {"step": 42, "compute_s": compute_s}}
    assert c._ahead_step() == (None if margin is None else 42 + margin)


def test_one_slow_step_does_not_shrink_a_control_changes_margin():
    """The ranks step together: a rank whose last step was slow (a GC pause) does not make
    the job look slower, or the margin in steps would fall short once the pace is back."""
    c, store, clock, log = make()
    c.plan = SimpleNamespace(ranks=[0, 1])
    c._read_beats = lambda ranks: {0: {"step": 40, "compute_s": 0.1}, 1: {"step": 42, "compute_s": 2.0}}
    assert c._ahead_step() == 42 + 3 + 7


def _auto_job(cost_s, mttf_h=1.0, auto=True):
    """A 2-rank job under --snapshot-every auto (starting every 10 steps) whose ranks beat
    at 0.5 s a step and report a snapshot cost."""
    store, clock, log = DictStore(), Clock(), []
    job = {"snapshot_auto": auto, "snapshot_every_steps": 10, "rank_mttf_h": mttf_h}
    c = Coordinator(store, LaunchSettings(script=["x.py"], nproc=2, env={"SEAMGUARD_SETTINGS": json.dumps(job)}),
                    [0, 1], [2], None, 30.0, log.append, clock=clock)
    run_first_generation(c, store, [0, 1, 2])
    return c, store, clock, log


def _beat_costs(c, store, clock, costs, steps, copies=1):
    for step in steps:
        clock.t += 0.5
        for w, cost in zip(c.plan.ranks, costs):
            store.set(keys.heartbeat(w), json.dumps({"n": step, "step": step, "phase": "compute", "compute_s": 0.4,
                                                     "gen": 0, "snap_cost_s": cost, "copies": copies}))
        c.tick()


def test_auto_counts_only_the_failures_no_live_copy_covers():
    """Both ranks hold the whole state (data parallelism): a snapshot serves only a loss of
    both within the exposed window (the hang timeout plus, before any recovery, the bound
    on one), so the interval is Daly's for that rarer failure, not for every failure."""
    c, store, clock, log = _auto_job(cost_s=None, mttf_h=1.0)
    _beat_costs(c, store, clock, [0.8, 0.8], range(1, 12), copies=2)
    (ev,) = [e for e in log if e["event"] == "snapshot_interval"]
    window_s = c.settings.hang_timeout_s + 60.0   # recovery_timeout_s's default
    mttf_s = 3600.0 ** 2 / (2 * window_s)
    assert ev["live_copies"] == 2 and ev["uncovered_mttf_h"] == pytest.approx(mttf_s / 3600, rel=1e-3)
    assert abs(ev["every_steps"] - daly_interval_s(0.8, mttf_s) / 0.5) <= 3
    # one rank whose private bytes cannot go ahead of the step: every failure counts again
    # (the change is beyond the retune factor, so it is published)
    _beat_costs(c, store, clock, [0.8, 0.8], range(12, 16), copies=1)
    assert [e for e in log if e["event"] == "snapshot_interval"][-1]["live_copies"] == 1
    assert abs(cadence.parse(store.get(keys.SNAPSHOT_CADENCE).decode())[-1].every_steps
               - daly_interval_s(0.8, 1800.0) / 0.5) <= 3


def test_auto_snapshot_interval_is_published_from_the_costliest_ranks_cost():
    c, store, clock, log = _auto_job(cost_s=None)
    _beat_costs(c, store, clock, [None, None], range(1, 6))   # nothing measured yet: nothing set
    assert keys.SNAPSHOT_CADENCE not in store.d
    _beat_costs(c, store, clock, [0.2, 0.8], range(6, 12))
    (entry,) = cadence.parse(store.get(keys.SNAPSHOT_CADENCE).decode())
    # Daly for 0.8 s (the costlier rank) and 2 ranks failing every hour each (M = 1800 s):
    # 53.1 s, about 106 steps of 0.5 s
    first = entry.every_steps
    assert abs(first - daly_interval_s(0.8, 1800.0) / 0.5) <= 3
    assert entry.start_step >= 6 + 3   # published at step 6, 3+ steps ahead: every rank reads it first
    (ev,) = [e for e in log if e["event"] == "snapshot_interval"]
    assert ev["every_steps"] == first and ev["cost_s"] == 0.8 and ev["ranks"] == 2
    # noise within the factor publishes nothing new; a cost 4x higher doubles the interval
    _beat_costs(c, store, clock, [0.2, 1.0], range(12, 16))
    assert len(cadence.parse(store.get(keys.SNAPSHOT_CADENCE).decode())) == 1
    _beat_costs(c, store, clock, [3.2, 3.2], range(16, 20))
    old, new = cadence.parse(store.get(keys.SNAPSHOT_CADENCE).decode())
    assert old.every_steps == first and abs(new.every_steps / first - 2.0) < 0.05
    assert new.start_step >= 16 + 3


def test_a_fixed_snapshot_interval_is_never_changed():
    c, store, clock, log = _auto_job(cost_s=None, auto=False)
    _beat_costs(c, store, clock, [0.8, 0.8], range(1, 12))
    assert keys.SNAPSHOT_CADENCE not in store.d and not [e for e in log if e["event"] == "snapshot_interval"]


def test_a_launcher_taking_the_coordinator_over_reads_the_job_back_and_judges_the_dead_node_at_once():
    """Node 0's coordinator ran generation 0 and died; node 1's launcher was elected. Its
    Coordinator starts from the store alone: the running generation, then node 0's rank
    and spare lost in one verdict and node 1's spare in the lost rank's place."""
    _, store, clock, _ = _two_nodes()
    store.add(keys.HINT_CHECKPOINT, 1)   # a hint its predecessor could already have taken
    log = []
    s = LaunchSettings(script=["x.py"], nproc=1, spares=1, nnodes=2, node_rank=1, master_port=29500)
    c = Coordinator(store, s, [0, 2], [1, 3], None, 30.0, log.append, clock=clock)
    assert c.take_over(0, set(), grace_s=5.0) == "running"
    assert (c.plan.gen, c._hint_checkpoint) == (0, 1)
    clock.t += 0.05
    c.tick()
    assert [(e["node"], e["wids"]) for e in log if e["event"] == "node_lost"] == [(0, [0, 1])]
    assert c.plan.gen == 1 and c.plan.ranks == [3, 2]   # node 1's spare took rank 0; w2 kept rank 1
    assert store.check([keys.plan(1)])
