"""Leader failover of an HA controller under a live fleet: kill -9s and partitions.

The fleet is the twin served as metrics and scraped by a real Prometheus; the controller
is 3 `seamguard run` replicas with ``ha:`` (etcd lease, shared PostgreSQL ledger, a log
actuator file as the world they act on), built by testbed/ha_pair.py. The benchmark kills
the leader with SIGKILL ``--kills`` times (at a random point of its tick, the killed
replica restarted as a follower), then cuts the leader off from etcd ``--partitions``
times (its proxy blocked: it still reaches the ledger), healing it after a new leader
ticks.

Measured, per failover: the lease's end as etcd saw it (the key's delete event, from an
outside watch) to the new leader's first finished tick (the ledger's ticks of its token),
in seconds and in tick periods; for a partition, how long before its lease ended the cut
leader made its last write. Audited at the end (testbed/ha_pair.audit): actions applied
twice, lost, reaching the world without their ledger row, or taken while their term's key
was not held (acted by two leaders at once), and undone: reverts a new term made in its
first 3 ticks whose key was applied again later (an action a takeover took back while it
was still wanted; the reverts in those ticks are counted too, most are the policy's own).

    PYTHONPATH=src python benchmarks/ha_failover.py            # 20 kills, 5 partitions (~3 min)
    PYTHONPATH=src python benchmarks/ha_failover.py --quick    # 8 kills, 2 partitions (~1.5 min)

Last line: one JSON object; also written to benchmarks/results/ha_failover[_quick].json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from seamguard.testbed.ha_pair import HaFleet, audit, takeovers

RESULTS = Path(__file__).parent / "results"


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _term(fleet: HaFleet, token: int, timeout_s: float) -> dict | None:
    """The ledger's record of the term once it has finished its first tick."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for t in takeovers(fleet.ledger_url):
            if t["token"] == token and t["first_tick_wall_s"] is not None:
                return t
        time.sleep(0.02)
    return None


def _failover(fleet: HaFleet, old, timeout_s: float = 30.0) -> dict:
    gone = fleet.watch.wait_for(lambda e: e.kind == "delete" and e.revision == old.revision, timeout_s)
    if gone is None:
        raise RuntimeError(f"the lease of token {old.revision} never ended")
    new = fleet.wait_leader(timeout_s)
    if new is None or new.revision <= old.revision:
        raise RuntimeError("no new leader")
    term = _term(fleet, new.revision, timeout_s)
    if term is None:
        raise RuntimeError(f"the new leader (token {new.revision}) never ticked")
    return {"old": old.holder, "new": term["holder"], "token": new.revision, "lease_end_wall_s": gone.wall_s,
            "takeover_s": term["first_tick_wall_s"] - gone.wall_s}


def _last_write_wall(fleet: HaFleet, token: int) -> float:
    import psycopg

    with psycopg.connect(fleet.ledger_url) as conn:
        t = conn.execute("SELECT MAX(GREATEST(wall_started, COALESCE(wall_finished, 0))) FROM ticks WHERE fence=%s",
                         (token,)).fetchone()[0]
        a = conn.execute("SELECT MAX(wall_time) FROM actions WHERE fence=%s", (token,)).fetchone()[0]
    return max(x for x in (t, a, 0.0) if x is not None)


def _wait_follower_ready(fleet: HaFleet, name: str, timeout_s: float = 30.0) -> None:
    """Until the restarted replica's loop runs (its log says the controller started)."""
    deadline = time.monotonic() + timeout_s
    log = fleet.members[name].log
    start = log.stat().st_size if log.exists() else 0
    while time.monotonic() < deadline:
        if log.exists() and b"controller started" in log.read_bytes()[start:]:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not restart (see {log})")


def run(kills: int, partitions: int, replicas: int, lease_s: int, tick_s: float, speed: float, seed: int,
        workdir: Path) -> dict:
    rng = random.Random(seed)
    period = tick_s / speed
    est_wall_s = 20 + kills * (lease_s + 2.5 * period) + partitions * (lease_s + 4 * period)
    minutes = max(10.0, est_wall_s * speed / 60.0)
    events: list[dict] = []
    with HaFleet(workdir, replicas=replicas, lease_s=lease_s, tick_s=tick_s, speed=speed, minutes=minutes,
                 seed=seed, env=_env()) as fleet:
        if fleet.wait_leader(60) is None:
            raise RuntimeError("no replica took the lease")
        time.sleep(3 * period)
        for i in range(kills):
            old = fleet.watch.holder()
            time.sleep(rng.uniform(0, period))  # anywhere in a tick: mid-action kills included
            t_kill = fleet.kill(old.holder)
            ev = _failover(fleet, old)
            ev.update(kind="kill", kill_to_lease_end_s=ev["lease_end_wall_s"] - t_kill)
            events.append(ev)
            fleet.launch(old.holder)
            _wait_follower_ready(fleet, old.holder)
            time.sleep(period)
            print(f"kill {i + 1}/{kills}: {old.holder} -> {ev['new']}, takeover {ev['takeover_s']:.3f} s after "
                  f"the lease ended", file=sys.stderr)
        for i in range(partitions):
            old = fleet.watch.holder()
            time.sleep(rng.uniform(0, period))
            t_cut = fleet.partition(old.holder)
            try:
                ev = _failover(fleet, old)
                last = _last_write_wall(fleet, old.revision)
            finally:
                fleet.heal(old.holder)
            ev.update(kind="partition", stopped_before_lease_end_s=ev["lease_end_wall_s"] - last,
                      acted_after_cut_s=max(0.0, last - t_cut))
            time.sleep(3 * period)
            ev["wrote_after_heal"] = _last_write_wall(fleet, old.revision) != last
            events.append(ev)
            print(f"partition {i + 1}/{partitions}: {old.holder} stopped {ev['stopped_before_lease_end_s']:.3f} s "
                  f"before its lease ended; {ev['new']} took over {ev['takeover_s']:.3f} s after", file=sys.stderr)
        time.sleep(2 * period)
        counts = audit(fleet.ledger_url, fleet.actions_file, fleet.watch.snapshot())
    take = [e["takeover_s"] for e in events]
    parts = [e for e in events if e["kind"] == "partition"]
    return {
        "benchmark": "ha_failover", "kills": kills, "partitions": partitions, "replicas": replicas,
        "lease_s": lease_s, "tick_period_s": period, "failovers": len(events),
        "takeover_s_median": round(statistics.median(take), 3), "takeover_s_max": round(max(take), 3),
        "takeover_periods_median": round(statistics.median(take) / period, 3),
        "takeover_periods_max": round(max(take) / period, 3),
        "within_2_periods": sum(t <= 2 * period for t in take),
        "kill_to_lease_end_s_max": round(max((e["kill_to_lease_end_s"] for e in events if e["kind"] == "kill"),
                                             default=0.0), 3),
        "partition_stopped_before_lease_end_s_min": round(min((e["stopped_before_lease_end_s"] for e in parts),
                                                              default=0.0), 3),
        "partition_leaders_writing_after_heal": sum(e["wrote_after_heal"] for e in parts),
        "actions": counts["actions"], "duplicated": counts["duplicated"], "lost": counts["lost"],
        "unledgered": counts["unledgered"], "double_led": counts["double_led"],
        "undone": counts["reverted_on_takeover"]["undone"],
        "reverts_in_first_3_ticks_of_a_term": counts["reverted_on_takeover"]["reverts"],
        "events": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in e.items()} for e in events],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 kills and 2 partitions (about 1.5 minutes)")
    ap.add_argument("--kills", type=int, default=None)
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--lease-s", type=int, default=2)
    ap.add_argument("--tick-s", type=float, default=10.0, help="simulated seconds per controller tick")
    ap.add_argument("--speed", type=float, default=10.0, help="simulated seconds per wall second")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    kills = args.kills if args.kills is not None else (8 if args.quick else 20)
    partitions = args.partitions if args.partitions is not None else (2 if args.quick else 5)
    if kills < 1 or partitions < 0 or args.replicas < 2:
        ap.error("--kills >= 1, --partitions >= 0 and --replicas >= 2")
    with tempfile.TemporaryDirectory(prefix="seamguard-ha-bench-") as tmp:
        result = run(kills, partitions, args.replicas, args.lease_s, args.tick_s, args.speed, args.seed, Path(tmp))
    result["command"] = " ".join(["python", "benchmarks/ha_failover.py", *sys.argv[1:]])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"ha_failover{'_quick' if args.quick else ''}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "events"}))


if __name__ == "__main__":
    main()
