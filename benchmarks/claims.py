"""The headline claims table, built from the committed results in benchmarks/results/.

Why this file exists: a figure in the README or docs/benchmarks.md is only as good as the
result file behind it. Every headline is declared once, in ``CLAIMS`` below (result
file or glob, the JSON path of seamguard's figure, the paths of its opponents), and this
script reads it from the JSON: the value, the strongest opponent in that result, the
ratio to it, the spread, n, the commit, quick or full, the machine load, and a tag for
every component that was simulated rather than real. A field a result does not record
prints as "not recorded". A new result is one more entry in ``CLAIMS``.

    python benchmarks/claims.py            # print the table (markdown)
    python benchmarks/claims.py --write    # put it into README.md and docs/benchmarks.md
    python benchmarks/claims.py --check    # exit 1 if a doc's figure disagrees with it

The docs carry generated blocks between ``<!-- claims:table begin -->`` and
``<!-- claims:table end -->`` (the table), ``<!-- claims:lines begin/end -->`` (one line
per claim) or ``<!-- claims:capabilities begin/end -->`` (one line per capability: its
claim in ``HEADLINES``), and inline figures as ``<!-- claim:KEY:FIELD -->text<!-- /claim -->``
(FIELD: one of ``FIELDS``: value, opponent, opponent_value, opponent_spread, ratio,
ratio_spread, spread, n). Last line printed: one JSON object.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
DOCS = (ROOT / "README.md", ROOT / "docs" / "benchmarks.md")
NOT_RECORDED = "not recorded"

#: What each simulation tag stands for (printed under the table).
TAGS = {
    "netns-hosts": "hosts are network namespaces on one VM (veth links, no NICs)",
    "bond-standin": "the bond is a stand-in (a bridge and a carrier monitor; no kernel bonding driver)",
    "emulated-pool": "the inference pool is emulated (no model; KV crosses tc-shaped links)",
    "cpu-gloo": "CPU tensors over gloo (no GPU, no NCCL)",
    "twin-telemetry": "telemetry made by the twin, faults injected by it",
    "event-twin": "cluster and failures simulated by the event-mode twin",
    "sim-traffic": "token traffic replayed in a simulation (no model server)",
    "stub-backend": "the backend is a stub that answers at once",
    "one-gpu": "one H100; no NCCL across GPUs",
    "sim-launchers": "node launchers simulated (one sending thread per process, 3 processes on the same 2 cores as etcd and the coordinator)",
}

#: A value path: '/'-separated keys, '*' for every element of a list or dict. A pair of
#: paths is their element-wise quotient (numerator, denominator).
Path_ = str | tuple[str, str]


@dataclass(frozen=True)
class Claim:
    """One headline: where its figures are, which way is better, what was simulated."""
    key: str                    #: stable id; docs' inline markers name it
    capability: str             #: the docs/benchmarks.md section it belongs to
    claim: str                  #: what the figure is, with its unit
    results: str                #: file or glob under benchmarks/results/
    value: Path_                #: seamguard's figure
    opponents: dict[str, Path_] = field(default_factory=dict)  #: name -> figure
    better: str = "lower"       #: "lower" or "higher": picks the strongest opponent
    simulated: tuple[str, ...] = ()
    goal: tuple[str, float] | None = None   #: (">=" or "<=", threshold)
    goal_of: str = "value"      #: what the goal bounds: "value" or "ratio"
    n: str | None = None        #: path of a count, where the figure is one aggregate
    exclude: str | None = None  #: glob of files the results glob must skip


def _detection_claims(suffix: str, results: str, recall: str, precision: str) -> tuple[Claim, Claim]:
    """Recall and precision per alarm of one detection result's held-out arm, beside the operator rules."""
    arm = "arms/heldout/{}/overall/{}"
    return tuple(Claim(f"detection_{name}{suffix}", "detection", claim, results, arm.format("seamguard", figure),
                       {"operator rules": arm.format("operator_rules", figure)}, better="higher",
                       goal=(">=", 0.95), n=arm.format("seamguard", count), simulated=("twin-telemetry",))
                 for name, claim, figure, count in (("recall", recall, "recall", "incidents"),
                                                    ("precision", precision, "precision_per_alarm", "alarms")))


CLAIMS: tuple[Claim, ...] = (
    Claim("demo_detected", "demo", "faults detected of the 6 injected, 2,048 GPUs, 30 min, per seed",
          "demo.json", "seeds/*/detected", better="higher", simulated=("twin-telemetry",)),
    Claim("demo_false_actions", "demo", "actions on entities no fault touched, per seed", "demo.json",
          "seeds/*/false_actions", goal=("<=", 0), simulated=("twin-telemetry",)),
    Claim("demo_delay", "demo", "median detection delay, per seed, s", "demo.json",
          "seeds/*/median_detection_delay_s", simulated=("twin-telemetry",)),
    Claim("demo_throughput", "demo", "useful throughput (share of GPU time), per seed", "demo.json",
          "seeds/*/useful_throughput_with_control",
          {"the same seed without the controller": "seeds/*/useful_throughput_without_control"},
          better="higher", simulated=("twin-telemetry",)),
    # CPU time of the tick's process: on this shared 2-core VM the wall time mostly measures the
    # queue (each result records both, and the load); on an idle core the two are the same.
    Claim("tick_100k", "tick", "controller tick (assess + decide) at 100k GPUs, CPU s", "tick.json",
          "tick_cpu_s", goal=("<=", 1.0), simulated=("twin-telemetry",)),
    Claim("tick_1m", "tick", "controller tick (assess + decide) at 1M GPUs, CPU s", "tick_1000000.json",
          "tick_cpu_s", goal=("<=", 2.0), simulated=("twin-telemetry",)),
    Claim("tick_100k_series16", "tick",
          "controller tick at 100k GPUs, each with 16 more series no channel names, CPU s", "tick_series16.json",
          "tick_cpu_s", goal=("<=", 1.0), simulated=("twin-telemetry",)),
    Claim("tick_evidence", "tick", "GPU evidence on 10k GPUs (16 channels vs 3 checks), s",
          "tick.json", "seamguard_gpu_evidence_s",
          {"per-GPU Python loop of threshold checks": "baseline_gpu_loop_s"},
          simulated=("twin-telemetry",)),
    Claim("twin_ettr", "twin_scale",
          "ETTR of one job on 100k GPUs, r_f 6.5e-3/node-day, over CPU/H100 runtime figures x the "
          "measured detector",
          "twin_scale.json", "ettr/seamguard",
          {"baseline_fixed (Daly interval)": "ettr/baseline_fixed",
           "baseline_daly_async": "ettr/baseline_daly_async",
           "in_job_restart + bonding + NVRx stragglers": "ettr/in_job_restart"},
          better="higher", goal=(">=", 0.97), n="runs_total", simulated=("event-twin",)),
    Claim("twin_wall", "twin_scale", "30 simulated days of 100k GPUs on one core, wall s",
          "twin_scale.json", "wall_s", goal=("<=", 30.0), simulated=("event-twin",)),
    Claim("prometheus_ingest", "prometheus_ingest",
          "one tick's ingest from Prometheus, 10k GPUs (142k series), s", "prometheus_ingest_quick.json",
          "ingest_s", {"per-metric queries, per-series lookup": "baseline_s"}, n="repeat"),
    Claim("api_summary", "api_latency", "fleet summary over HTTP at 100k GPUs, p50 ms",
          "api_latency_quick.json", "summary_p50_ms",
          {"vectorized numpy handler": "baseline_summary_p50_ms"}, simulated=("twin-telemetry",)),
    Claim("rail_stall", "rail_failover", "longest stall per rail flap, s", "rail_failover.json",
          "summary/seamguard/max_stall_s_per_flap",
          {"bond (active-backup)": "summary/bond_active_backup/max_stall_s_per_flap",
           "one rail, default timeout": "summary/default_timeout/max_stall_s_per_flap",
           "one rail, 5 s timeout + restart": "summary/single_rail_restart/max_stall_s_per_flap"},
          simulated=("netns-hosts", "bond-standin", "cpu-gloo")),
    Claim("rail_steady", "rail_failover", "steady training steps/s without flaps",
          "rail_failover.json", "summary/seamguard/steps_per_s",
          {"bond (active-backup)": "summary/bond_active_backup/steps_per_s",
           "one rail, default timeout": "summary/default_timeout/steps_per_s"},
          better="higher", simulated=("netns-hosts", "bond-standin", "cpu-gloo")),
    Claim("rail_steady_bond", "rail_failover",
          "steady steps/s without flaps, seamguard / the bond's, every flap-free pair run back to back, "
          "before eee42b3",
          "rail_failover_steady*.json", ("reps/*/seamguard/steps_per_s", "reps/*/bond_active_backup/steps_per_s"),
          better="higher", goal=(">=", 0.95), simulated=("netns-hosts", "bond-standin", "cpu-gloo"),
          exclude="rail_failover_steady_eee42b3*.json"),
    Claim("rail_steady_bond_now", "rail_failover",
          "the same on eee42b3 (a vote in two store round trips, chunk buffers reused), three --steady 5 runs",
          "rail_failover_steady_eee42b3*.json",
          ("reps/*/seamguard/steps_per_s", "reps/*/bond_active_backup/steps_per_s"),
          better="higher", goal=(">=", 0.95), simulated=("netns-hosts", "bond-standin", "cpu-gloo")),
    Claim("rail_steady_bond_early", "rail_failover",
          "the same on dfe5086 (one synchronisation a step: the vote settled behind the next compute), "
          "two --steady 5 runs",
          "rail_failover_early_steady_*.json",
          ("reps/*/seamguard/steps_per_s", "reps/*/bond_active_backup/steps_per_s"),
          better="higher", goal=(">=", 0.95), simulated=("netns-hosts", "bond-standin", "cpu-gloo")),
    Claim("rail_steady_bond_settler", "rail_failover",
          "the same on 2e6cdb3 (the vote settled by one long-lived helper thread), one --steady 5 run",
          "rail_failover_settler_steady.json",
          ("reps/*/seamguard/steps_per_s", "reps/*/bond_active_backup/steps_per_s"),
          better="higher", goal=(">=", 0.95), simulated=("netns-hosts", "bond-standin", "cpu-gloo")),
    Claim("rail_steady_bond_lowload", "rail_failover",
          "the same code (2e6cdb3's rails) on an otherwise idle machine, one --steady 5 run",
          "rail_failover_settler_steady_lowload.json",
          ("reps/*/seamguard/steps_per_s", "reps/*/bond_active_backup/steps_per_s"),
          better="higher", goal=(">=", 0.95), simulated=("netns-hosts", "bond-standin", "cpu-gloo")),
    Claim("rail_steady_standby", "rail_failover",
          "steady steps/s without flaps over the bond's, active-standby rails (--rail-mode standby: one rail "
          "carries, the other waits), every flap-free round run back to back, after the follower, two runs",
          "rail_failover_standby_steady*.json",
          ("reps/*/seamguard_standby/steps_per_s", "reps/*/bond_active_backup/steps_per_s"),
          better="higher", goal=(">=", 0.95), simulated=("netns-hosts", "bond-standin", "cpu-gloo")),
    Claim("rail_steady_striped", "rail_failover",
          "the same rounds, rails striped (the default: both rails carry every all-reduce)",
          "rail_failover_standby_steady*.json",
          ("reps/*/seamguard/steps_per_s", "reps/*/bond_active_backup/steps_per_s"),
          better="higher", goal=(">=", 0.95), simulated=("netns-hosts", "bond-standin", "cpu-gloo")),
    Claim("rail_stall_standby", "rail_failover", "longest stall per rail flap, active-standby rails, --quick, s",
          "rail_failover_quick_standby.json", "summary/seamguard_standby/max_stall_s_per_flap",
          {"bond (active-backup)": "summary/bond_active_backup/max_stall_s_per_flap"},
          goal=("<=", 1.0), simulated=("netns-hosts", "bond-standin", "cpu-gloo")),
    Claim("rail_steady_bond_quick", "rail_failover",
          "the same within a --quick repetition (flap-free runs minutes apart), after the baseline fix",
          "rail_failover_quick_fixed_baseline.json",
          ("reps/*/seamguard/steps_per_s", "reps/*/bond_active_backup/steps_per_s"),
          better="higher", goal=(">=", 0.95), simulated=("netns-hosts", "bond-standin", "cpu-gloo")),
    Claim("train_job_wide", "failover_training", "every rank killed at once to the first step, 4 ranks, s",
          "failover_training.json", "seamguard_job_wide/resume_s_max",
          {"torchrun + DCP async (any kill)": "torchrun/spread/resume_s"}, n="seamguard_job_wide/runs",
          simulated=("cpu-gloo",)),
    Claim("train_kill_lost", "failover_training",
          "seconds of progress lost per SIGKILL of 1 of 4 ranks at a uniformly random point of the "
          "step, every kill, s",
          "failover_training.json", "reps/*/failures/seamguard/*/lost_s",
          {"torchft": "reps/*/failures/torchft/*/lost_s",
           "torchrun + DCP async": "reps/*/failures/torchrun/*/lost_s"}, simulated=("cpu-gloo",)),
    Claim("train_kill_cost", "failover_training",
          "training time with the kills minus the same system's failure-free time, per kill, "
          "each repetition, s",
          "failover_training.json", "seamguard/spread/failure_cost_per_failure_s",
          {"torchft": "torchft/spread/failure_cost_per_failure_s",
           "torchrun + DCP async": "torchrun/spread/failure_cost_per_failure_s"}, simulated=("cpu-gloo",)),
    Claim("train_kill_resume", "failover_training", "kill to next committed step, the same kills, s",
          "failover_training.json", "reps/*/failures/seamguard/*/resume_s",
          {"torchft": "reps/*/failures/torchft/*/resume_s",
           "torchrun + DCP async": "reps/*/failures/torchrun/*/resume_s"}, simulated=("cpu-gloo",)),
    Claim("train_kill_redone", "failover_training", "steps redone per kill, the same kills",
          "failover_training.json", "reps/*/failures/seamguard/*/steps_lost",
          {"torchft": "reps/*/failures/torchft/*/steps_lost",
           "torchrun + DCP async": "reps/*/failures/torchrun/*/steps_lost"}, simulated=("cpu-gloo",)),
    Claim("train_failure_free", "failover_training",
          "failure-free training time / plain DDP's, same repetition",
          "failover_training.json", ("reps/*/window_s/seamguard_clean", "reps/*/window_s/plain_clean"),
          {"torchft": ("reps/*/window_s/torchft_clean", "reps/*/window_s/plain_clean"),
           "torchrun + DCP async": ("reps/*/window_s/torchrun_clean", "reps/*/window_s/plain_clean")},
          goal=("<=", 1.10), simulated=("cpu-gloo",)),
    Claim("train_goodput", "failover_training",
          "useful samples per provisioned rank-second with the kills (seamguard's hot spare charged "
          "as a 5th rank)",
          "failover_training.json", "reps/*/goodput_samples_per_rank_s/seamguard_faults",
          {"torchft": "reps/*/goodput_samples_per_rank_s/torchft_faults",
           "torchrun + DCP async": "reps/*/goodput_samples_per_rank_s/torchrun_faults"},
          better="higher", simulated=("cpu-gloo",)),
    Claim("train_goodput_free", "failover_training",
          "useful samples per provisioned rank-second without kills (the spare charged the same way)",
          "failover_training.json", "reps/*/goodput_samples_per_rank_s/seamguard_clean",
          {"torchft": "reps/*/goodput_samples_per_rank_s/torchft_clean",
           "torchrun + DCP async": "reps/*/goodput_samples_per_rank_s/torchrun_clean"},
          better="higher", simulated=("cpu-gloo",)),
    Claim("hsdp_resume", "failover_training",
          "kill (rank or host) to next step, HSDP 2 hosts, every committed full run, s",
          "failover_training_fsdp_hosts_hsdp*.json", "reps/*/failures/seamguard/*/resume_s",
          {"torchft": "reps/*/failures/torchft/*/resume_s",
           "torchrun + DCP": "reps/*/failures/torchrun/*/resume_s"},
          exclude="*_quick.json", simulated=("netns-hosts", "cpu-gloo")),
    Claim("hsdp_cost", "failover_training",
          "time lost per kill, HSDP 2 hosts, each committed full run's median, s",
          "failover_training_fsdp_hosts_hsdp*.json", "seamguard/spread/failure_cost_per_failure_s",
          {"torchft": "torchft/spread/failure_cost_per_failure_s",
           "torchrun + DCP": "torchrun/spread/failure_cost_per_failure_s"},
          exclude="*_quick.json", simulated=("netns-hosts", "cpu-gloo")),
    Claim("hsdp_steps_lost", "failover_training",
          "steps redone per kill, HSDP 2 hosts, every committed full run",
          "failover_training_fsdp_hosts_hsdp*.json", "reps/*/failures/seamguard/*/steps_lost",
          {"torchft": "reps/*/failures/torchft/*/steps_lost",
           "torchrun + DCP": "reps/*/failures/torchrun/*/steps_lost"},
          exclude="*_quick.json", simulated=("netns-hosts", "cpu-gloo")),
    Claim("hsdp_failure_free", "failover_training",
          "failure-free wall / plain loop's, HSDP 2 hosts, every committed full run",
          "failover_training_fsdp_hosts_hsdp*.json",
          ("reps/*/window_s/seamguard_clean", "reps/*/window_s/plain_clean"),
          {"torchft": ("reps/*/window_s/torchft_clean", "reps/*/window_s/plain_clean"),
           "torchrun + DCP": ("reps/*/window_s/torchrun_clean", "reps/*/window_s/plain_clean")},
          goal=("<=", 1.10), exclude="*_quick.json", simulated=("netns-hosts", "cpu-gloo")),
    Claim("hsdp_overhead_interleaved", "failover_training",
          "failure-free wall / plain HSDP's, 2 hosts, 5 interleaved reps a run (fsdp_overhead.py "
          "--hosts 2 --replicate 2 --snapshot-every auto), two runs on 083323f",
          "fsdp_overhead_hosts_hsdp_everyauto_s19*.json", ("window_s/seamguard/*", "window_s/plain/*"),
          goal=("<=", 1.10), simulated=("netns-hosts", "cpu-gloo")),
    Claim("hsdp_overhead_now", "failover_training",
          "the same, 5 interleaved reps on the shared tree of 2026-12-07 12:36-12:55 UTC (load 10-22)",
          "fsdp_overhead_hosts_hsdp_everyauto_s20.json", ("window_s/seamguard/*", "window_s/plain/*"),
          goal=("<=", 1.10), simulated=("netns-hosts", "cpu-gloo")),
    Claim("hsdp_overhead_s21", "failover_training",
          "the same, 5 interleaved reps on the shared tree of 2026-12-07 16:09-16:23 UTC (load 5.7-20.7)",
          "fsdp_overhead_hosts_hsdp_everyauto_s21.json", ("window_s/seamguard/*", "window_s/plain/*"),
          goal=("<=", 1.10), simulated=("netns-hosts", "cpu-gloo")),
    Claim("gpu_stall", "gpu_runtime", "step stall of one snapshot of a 4.8 GB state, s",
          "gpu_runtime_h100.json", "micro/stall_used_s/sg_overlap",
          {"torch.save + fsync": "micro/stall_used_s/torch_save",
           "DCP async_save": "micro/stall_used_s/dcp_async"}, simulated=("one-gpu",)),
    Claim("gpu_restore", "gpu_runtime", "restore of that state to the GPU, s",
          "gpu_runtime_h100.json", "micro/restore_s/sg_restore",
          {"torch.load": "micro/restore_s/torch_load", "DCP load": "micro/restore_s/dcp_load"},
          simulated=("one-gpu",)),
    Claim("gpu_failure_free", "gpu_runtime",
          "failure-free wall / plain loop's, snapshot every 50 steps (Young's interval)",
          "gpu_runtime_h100.json", "failure_free_wall_ratio", simulated=("one-gpu",)),
    Claim("gpu_spare", "gpu_runtime", "killed rank to next step with a warm spare, s",
          "gpu_runtime_h100.json", "recovery/warm_spare/runs/*/kill_to_step_s",
          {"cold replacement": "recovery/cold_replacement/runs/*/kill_to_step_s"},
          goal=("<=", 2.0), simulated=("one-gpu",)),
    *_detection_claims("", "detection_heldout.json",
                       "recall on held-out histories (seeds 1000-1019, the full 20-scenario plan of 256-4,096 GPUs; "
                       "shifted physics, generator 2026.12-2; detector frozen at d54c72a)",
                       "precision per alarm (a loop's members once), same histories"),
    *_detection_claims("_fresh", "detection_heldout_seeds4000.json",
                       "recall on held-out histories never run before (seeds 4000-4019, the same plan and "
                       "generator, the same frozen detector)",
                       "precision per alarm, seeds 4000-4019"),
    Claim("detection_precision_dev", "detection",
          "precision per alarm on the development seeds 0-19 (the histories the detector was tuned on), "
          "the same frozen detector", "detection_heldout.json", "arms/dev/seamguard/overall/precision_per_alarm",
          {"operator rules": "arms/dev/operator_rules/overall/precision_per_alarm"}, better="higher",
          goal=(">=", 0.95), n="arms/dev/seamguard/overall/alarms", simulated=("twin-telemetry",)),
    Claim("inference_goodput", "inference_routing",
          "goodput with one KV path slowed, 0.85 of capacity, req/s", "inference_routing_sweep.json",
          "levels/0.85/per_rep/seamguard/*/degraded/goodput_rps",
          {"round robin": "levels/0.85/per_rep/round_robin/*/degraded/goodput_rps",
           "least outstanding": "levels/0.85/per_rep/least_outstanding/*/degraded/goodput_rps"},
          better="higher", goal=(">=", 1.3), goal_of="ratio", simulated=("emulated-pool",)),
    Claim("inference_opponents_rails", "inference_routing",
          "goodput, one KV path slowed, 0.9 of capacity, 60 s runs, request-mix seeds never used before, every "
          "router sees every rail, req/s",
          "inference_routing_opponents_fresh*.json",
          "levels/0.9/arms/rails/routers/seamguard/degraded_goodput_rps/per_rep/*",
          {"p2c + outlier ejection": "levels/0.9/arms/rails/routers/p2c_eject/degraded_goodput_rps/per_rep/*",
           "prefix/queue/KV scorer": "levels/0.9/arms/rails/routers/prefix_kv/degraded_goodput_rps/per_rep/*"},
          better="higher", goal=(">=", 1.3), goal_of="ratio", simulated=("emulated-pool",)),
    Claim("inference_opponents_home", "inference_routing",
          "the same, every router (seamguard too) held to the home rail, req/s",
          "inference_routing_opponents_fresh*.json",
          "levels/0.9/arms/home/routers/seamguard/degraded_goodput_rps/per_rep/*",
          {"round robin": "levels/0.9/arms/home/routers/round_robin/degraded_goodput_rps/per_rep/*",
           "least outstanding": "levels/0.9/arms/home/routers/least_outstanding/degraded_goodput_rps/per_rep/*",
           "p2c + outlier ejection": "levels/0.9/arms/home/routers/p2c_eject/degraded_goodput_rps/per_rep/*",
           "prefix/queue/KV scorer": "levels/0.9/arms/home/routers/prefix_kv/degraded_goodput_rps/per_rep/*"},
          better="higher", goal=(">=", 1.3), goal_of="ratio", simulated=("emulated-pool",)),
    Claim("gateway_added", "gateway_overhead", "gateway's added p50 latency per request, ms",
          "gateway_overhead.json", "whole_added_p50_ms", simulated=("stub-backend",)),
    Claim("agent_cpu", "agent_overhead", "exporter CPU at a 15 s scrape, % of a core",
          "agent_overhead.json", "agent/pct_core_at_15s",
          {"node_exporter": "node_exporter/pct_core_at_15s"}, n="reps"),
    Claim("token_zombie", "token_gateway", "tokens lost to a leaked key (new source, 4 rps), 12 h",
          "token_gateway.json", "sim/seamguard/tokens_lost_to_zombie",
          {"static per-key caps": "sim/static/tokens_lost_to_zombie"}, n="seeds",
          simulated=("sim-traffic",)),
    Claim("token_owner_rejected", "token_gateway", "the leaked key's owner's requests refused, 12 h",
          "token_gateway.json", "sim/seamguard/owner_requests_rejected",
          {"static per-key caps": "sim/static/owner_requests_rejected"}, n="seeds",
          simulated=("sim-traffic",)),
    Claim("token_stealth_tokens", "token_gateway",
          "stealthy leak (known source, 1.5x the key's daily shape), held-out seeds, tokens leaked in 1 h",
          "token_gateway_quick.json", "leaks/stealth/seamguard/leak_tokens",
          {"static caps + spend alert": "leaks/stealth/static+alert/leak_tokens"}, n="seeds",
          simulated=("sim-traffic",)),
    Claim("token_stealth_detect", "token_gateway",
          "the same leak to seamguard's first step on the key, per held-out seed, s (static caps + spend "
          "alert: no alert within the hour in any seed)",
          "token_gateway_quick.json", "leaks/stealth/per_seed_time_to_detect_s/seamguard/*",
          simulated=("sim-traffic",)),
    Claim("token_stealth_owner_rejected", "token_gateway",
          "the same leak: the leaked key's own user's requests refused in the hour",
          "token_gateway_quick.json", "leaks/stealth/seamguard/owner_requests_rejected",
          {"static caps + spend alert": "leaks/stealth/static+alert/owner_requests_rejected"}, n="seeds",
          simulated=("sim-traffic",)),
    Claim("token_ramp_tokens", "token_gateway",
          "geometric ramp (the key's own client, 3.5x every 2 min), held-out seeds, tokens leaked in 30 min",
          "token_gateway_quick.json", "leaks/ramp/seamguard/leak_tokens",
          {"static caps + spend alert": "leaks/ramp/static+alert/leak_tokens"}, n="seeds",
          simulated=("sim-traffic",)),
    Claim("token_ramp_owner_rejected", "token_gateway",
          "the ramp: the leaked key's own user's requests refused in the 30 min",
          "token_gateway_quick.json", "leaks/ramp/seamguard/owner_requests_rejected",
          {"static caps + spend alert": "leaks/ramp/static+alert/owner_requests_rejected"}, n="seeds",
          simulated=("sim-traffic",)),
    Claim("token_leaks_legit_rejected", "token_gateway",
          "the other keys' requests refused, ramp and stealthy leak (n: the 2 leaks, each a 2-seed median)",
          "token_gateway_quick.json", "leaks/*/seamguard/legit_requests_rejected",
          {"static caps + spend alert": "leaks/*/static+alert/legit_requests_rejected"},
          simulated=("sim-traffic",)),
    Claim("drill_outage", "fault_drill", "actions taken while the telemetry was out (Prometheus down)",
          "fault_drill.json", "summary/actions_during_outage/current", goal=("<=", 0),
          simulated=("twin-telemetry",)),
    Claim("drill_crashes", "fault_drill", "actions duplicated or lost over controller kills",
          "fault_drill.json", "summary/duplicate_or_lost_actions/current", goal=("<=", 0),
          n="summary/crash_trials/current", simulated=("twin-telemetry",)),
    Claim("drill_storm", "fault_drill", "largest share of the fleet's capacity removed, XID-79 on every GPU",
          "fault_drill.json", "summary/max_capacity_removed_share/xid79_all_at_once/current/fleet",
          simulated=("twin-telemetry",)),
    Claim("ha_takeover", "ha_failover", "leader killed or cut off to a new leader acting, s",
          "ha_failover.json", "takeover_s_median", n="failovers"),
    Claim("adversary_bypassed", "adversary", "attacks on the HTTP ports that got through",
          "adversary.json", "bypassed", n="attacks"),
    Claim("membership_false_10k", "membership_load", "false verdicts at 10k ranks (1,250 nodes), liveness over signed links",
          "membership_load_links.json", "summary/links/10000/false_verdicts",
          {"node records in etcd": "summary/aggregated/10000/false_verdicts"}, goal=("<=", 0), n="reps",
          simulated=("sim-launchers",)),
    Claim("membership_detect_10k", "membership_load", "silent node seen at 10k ranks (1,250 nodes), s after it stopped",
          "membership_load_links.json", "summary/links/10000/detect_s", n="reps",
          simulated=("sim-launchers",)),
    Claim("membership_detect_10k_slowest", "membership_load",
          "silent node seen at 10k ranks (1,250 nodes), slowest repetition, s after it stopped",
          "membership_load_links.json", "summary/links/10000/detect_s/max", goal=("<=", 2), n="reps",
          simulated=("sim-launchers",)),
    Claim("membership_etcd_cpu_10k", "membership_load", "etcd CPU at 10k ranks, % of a core",
          "membership_load_links.json", "summary/links/10000/server_cpu_pct",
          {"node records in etcd": "summary/aggregated/10000/server_cpu_pct"}, n="reps",
          simulated=("sim-launchers",)),
    Claim("membership_coordinator_cpu_10k", "membership_load", "coordinator CPU at 10k ranks, % of a core",
          "membership_load_links.json", "summary/links/10000/coordinator_cpu_pct",
          {"node records in etcd": "summary/aggregated/10000/coordinator_cpu_pct"}, n="reps",
          simulated=("sim-launchers",)),
    Claim("seam_drill_ratio", "seam_drill",
          "useful throughput under Slurm with a cooling fault, steps/s",
          "seam_drill_slurm_slowdown.json", "useful_throughput_with_control",
          {"no control": "useful_throughput_without_control"}, better="higher",
          simulated=("netns-hosts", "cpu-gloo", "twin-telemetry")),
)


#: Per capability, the one claim its line in docs/benchmarks.md's "One line per capability"
#: block repeats: the figure against the strongest opponent a competent operator runs,
#: chosen whichever way it falls (where seamguard loses, that line says so).
HEADLINES: dict[str, str] = {
    "demo": "demo_throughput", "tick": "tick_1m", "twin_scale": "twin_ettr",
    "prometheus_ingest": "prometheus_ingest", "api_latency": "api_summary", "rail_failover": "rail_stall",
    "failover_training": "train_kill_lost", "gpu_runtime": "gpu_stall", "detection": "detection_recall_fresh",
    "inference_routing": "inference_opponents_rails", "gateway_overhead": "gateway_added",
    "agent_overhead": "agent_cpu", "token_gateway": "token_stealth_tokens", "fault_drill": "drill_crashes",
    "ha_failover": "ha_takeover", "adversary": "adversary_bypassed", "membership_load": "membership_false_10k",
    "seam_drill": "seam_drill_ratio",
}


class ClaimError(ValueError):
    """A claim whose result is missing or lacks a declared path (one line, names both)."""


@dataclass(frozen=True)
class Figure:
    """Values at one path, pooled over files and wildcards: median, min, max, n."""
    median: float
    lo: float
    hi: float
    n: int
    values: tuple[float, ...] = ()


def _walk(node, keys: list[str]) -> list:
    if not keys:
        return [node]
    head, rest = keys[0], keys[1:]
    if head == "*":
        items = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
        return [x for item in items for x in _walk(item, rest)]
    if isinstance(node, dict) and head in node:
        return _walk(node[head], rest)
    if isinstance(node, list) and head.isdigit() and int(head) < len(node):
        return _walk(node[int(head)], rest)
    return []


def _numbers(found: list) -> list[float]:
    """Flatten what a path found: numbers as they are; a recorded spread dict
    ({median, min, max, n} or {mean, ci95}) as its summary."""
    out: list[float] = []
    for x in found:
        if isinstance(x, bool) or x is None:
            continue
        if isinstance(x, (int, float)):
            out.append(float(x))
        elif isinstance(x, dict) and ("median" in x or "mean" in x):
            out.append(float(x.get("median", x.get("mean"))))
    return out


def _summary(found: list) -> Figure | None:
    """One recorded spread dict is taken as recorded; raw numbers are pooled."""
    if len(found) == 1 and isinstance(found[0], dict):
        d = found[0]
        if "median" in d and "min" in d:
            return Figure(d["median"], d["min"], d["max"], int(d.get("n", 1)))
        if "mean" in d and isinstance(d.get("ci95"), list) and len(d["ci95"]) == 2:
            return Figure(d["mean"], d["ci95"][0], d["ci95"][1], 0)
    vals = _numbers(found)
    if not vals:
        return None
    return Figure(statistics.median(vals), min(vals), max(vals), len(vals), tuple(vals))


def _at(docs: list[dict], spec: Path_, key: str) -> list:
    """What ``spec`` finds in every result file, in file order."""
    if isinstance(spec, tuple):
        num, den = (_numbers([x for d in docs for x in _walk(d, p.split("/"))]) for p in spec)
        if len(num) != len(den):
            raise ClaimError(f"claim {key}: {spec[0]} and {spec[1]} give {len(num)} and {len(den)} "
                             "values, not pairs")
        return [a / b for a, b in zip(num, den) if b]
    found = [x for d in docs for x in _walk(d, spec.split("/"))]
    return found


def load_results(c: Claim, results_dir: Path) -> list[tuple[str, dict]]:
    """The claim's result files, parsed (sorted by name)."""
    paths = sorted(glob.glob(str(results_dir / c.results)))
    if c.exclude:
        paths = [p for p in paths if not Path(p).match(c.exclude)]
    if not paths:
        raise ClaimError(f"claim {c.key}: no result file matches benchmarks/results/{c.results}")
    out = []
    for p in paths:
        try:
            out.append((Path(p).name, json.loads(Path(p).read_text())))
        except (OSError, ValueError) as e:
            raise ClaimError(f"claim {c.key}: {Path(p).name} is not readable JSON ({e})") from e
    return out


@dataclass(frozen=True)
class Row:
    """One claim read from its results: the table's row."""
    claim: Claim
    files: tuple[str, ...]
    value: Figure | None = None
    opponent: str | None = None
    opponent_figure: Figure | None = None
    ratio: Figure | None = None   #: value / opponent, per paired run where paired
    n: int | None = None
    commit: str = NOT_RECORDED
    run: str = NOT_RECORDED
    load: str = NOT_RECORDED
    goal: str = ""
    problem: str | None = None


def _figure(docs: list[dict], spec: Path_, key: str) -> Figure:
    fig = _summary(_at(docs, spec, key))
    if fig is None:
        raise ClaimError(f"claim {key}: no number at {spec!r}")
    if isinstance(spec, str) and fig.n == 1:
        # A single aggregate recorded with its range beside it: KEY and KEY_spread.
        spreads = [x for d in docs for x in _walk(d, (spec + "_spread").split("/"))]
        if len(spreads) == 1 and isinstance(spreads[0], list) and len(spreads[0]) == 2:
            lo, hi = (float(v) for v in spreads[0])
            fig = Figure(fig.median, min(lo, fig.median), max(hi, fig.median), 1)
    return fig


def _ratio(a: Figure, b: Figure) -> Figure | None:
    """Seamguard over the opponent; None where a ratio means nothing (a figure ≤ 0)."""
    if a.median < 0 or b.median <= 0 or min(a.lo, b.lo) < 0:
        return None
    if len(a.values) == len(b.values) > 1 and all(b.values):
        r = [x / y for x, y in zip(a.values, b.values)]
        return Figure(statistics.median(r), min(r), max(r), len(r), tuple(r))
    return Figure(a.median / b.median, a.median / b.median, a.median / b.median, 1) if b.median else None


def _meta(docs: list[dict]) -> tuple[str, str, str]:
    """Commit(s), quick/full, and the 1-minute load range the results record."""
    commits, runs, loads = [], set(), []
    for d in docs:
        prov = d.get("provenance") or {}
        c = prov.get("commit") or d.get("commit") or d.get("code_commit")
        if c and c not in commits:
            commits.append(str(c))
        mode = d.get("quick", (d.get("config") or {}).get("quick"))
        if mode is None and d.get("mode") in ("quick", "full"):
            mode = d["mode"] == "quick"
        if mode is None and isinstance(d.get("command"), str):   # recorded by _record.py's runner
            mode = "--quick" in d["command"].split()
        runs.add(None if mode is None else ("quick" if mode else "full"))
        for v in (prov.get("loadavg_1m"), prov.get("loadavg_1m_end"), d.get("loadavg_1m"), d.get("load"),
                  (d.get("loadavg_start") or [None])[0], (d.get("loadavg_end") or [None])[0]):
            loads.extend(_numbers(v if isinstance(v, list) else [v]))
    commit = NOT_RECORDED if not commits else ", ".join(commits[:3]) + (" …" if len(commits) > 3 else "")
    runs.discard(None)
    run = NOT_RECORDED if not runs else runs.pop() if len(runs) == 1 else "quick and full"
    load = NOT_RECORDED if not loads else (f"{min(loads):.1f}" if min(loads) == max(loads)
                                           else f"{min(loads):.1f}-{max(loads):.1f}")
    return commit, run, load


def _goal(c: Claim, value: Figure, ratio: Figure | None) -> str:
    """"≥ 0.97: met" or "...: missed" on the median; "" without a goal."""
    v = value if c.goal_of == "value" else ratio
    if c.goal is None or v is None:
        return ""
    op, bound = c.goal
    met = v.median >= bound if op == ">=" else v.median <= bound
    unit = "×" if c.goal_of == "ratio" else ""
    return f"{'≥' if op == '>=' else '≤'} {bound:g}{unit}: {'met' if met else 'missed'}"


def build_row(c: Claim, results_dir: Path = RESULTS_DIR) -> Row:
    """The claim's row; a missing file or path gives a row that says so."""
    try:
        named = load_results(c, results_dir)
        docs = [d for _, d in named]
        value = _figure(docs, c.value, c.key)
        opps = {name: _figure(docs, spec, c.key) for name, spec in c.opponents.items()}
    except ClaimError as e:
        return Row(c, (), problem=str(e))
    pick = min if c.better == "lower" else max
    opponent = pick(opps, key=lambda k: opps[k].median) if opps else None
    n = value.n
    if c.n:
        counts = _numbers([x for d in docs for x in _walk(d, c.n.split("/"))])
        n = int(sum(counts)) if counts else None
    commit, run, load = _meta(docs)
    ratio = _ratio(value, opps[opponent]) if opponent else None
    return Row(c, tuple(name for name, _ in named), value, opponent, opps.get(opponent), ratio,
               n, commit, run, load, _goal(c, value, ratio))


def build_table(claims=CLAIMS, results_dir: Path = RESULTS_DIR) -> list[Row]:
    return [build_row(c, results_dir) for c in claims]


def fmt(x: float) -> str:
    """Three significant figures, thousands separated, never scientific."""
    a = abs(x)
    if not math.isfinite(x):
        return str(x)
    if x == int(x) and a < 1e9:
        return f"{int(x):,}"
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.001:
        return f"{x:#.3g}" if a < 1 else f"{x:.2f}"
    return f"{x:.1e}"


def _spread(f: Figure | None) -> str:
    if f is None:
        return "—"
    if f.lo == f.hi:
        return fmt(f.median)
    return f"{fmt(f.lo)} to {fmt(f.hi)}" if f.lo < 0 else f"{fmt(f.lo)}-{fmt(f.hi)}"


FIELDS = ("value", "opponent", "opponent_value", "opponent_spread", "ratio", "ratio_spread", "spread", "n")


def fields(r: Row) -> dict[str, str]:
    """The strings a doc may quote of a row (inline markers name these)."""
    if r.problem:
        return dict.fromkeys(FIELDS, "missing")
    return {"value": fmt(r.value.median), "opponent": r.opponent or "none in this result",
            "opponent_value": fmt(r.opponent_figure.median) if r.opponent_figure else "—",
            "opponent_spread": _spread(r.opponent_figure),
            "ratio": (f"{fmt(r.ratio.median)}×" if r.ratio else
                      f"difference {fmt(r.value.median - r.opponent_figure.median)}" if r.opponent_figure
                      else "—"),
            "ratio_spread": _spread(r.ratio) if r.ratio and r.ratio.n > 1 else "—",
            "spread": _spread(r.value), "n": str(r.n) if r.n is not None else NOT_RECORDED}


HEADER = ("| capability | claim | seamguard | spread | strongest opponent | ratio (spread) | n | goal "
          "| commit | run | load 1 min | simulated |\n" + "|---" * 12 + "|")


def render_table(rows: list[Row]) -> str:
    lines = [HEADER]
    for r in rows:
        c, f = r.claim, fields(r)
        if r.problem:
            lines.append(f"| {c.capability} | {c.claim} | **missing**: {r.problem} |" + " |" * 9)
            continue
        opp = f"{f['opponent']} {f['opponent_value']}" if r.opponent else f["opponent"]
        ratio = f["ratio"] + (f" ({f['ratio_spread']})" if f["ratio_spread"] != "—" else "")
        lines.append(f"| {c.capability} | {c.claim} ({c.better} is better) | {f['value']} | {f['spread']} "
                     f"| {opp} | {ratio} | {f['n']} | {r.goal or '—'} | {r.commit} | {r.run} | {r.load} "
                     f"| {', '.join(c.simulated) or 'nothing'} |")
    used = sorted({t for r in rows for t in r.claim.simulated})
    lines.append("")
    lines.append("Simulated: " + "; ".join(f"`{t}` {TAGS[t]}" for t in used) + ". Spread: min-max over "
                 "runs (a mean's 95 % CI for the twin); ratio: seamguard / opponent, per paired run where "
                 "runs pair. Generated by `python benchmarks/claims.py --write` from benchmarks/results/.")
    return "\n".join(lines)


def render_lines(rows: list[Row], headlines_only: bool = False) -> str:
    """Per claim (or per capability: its headline claim), one line a skeptic can repeat."""
    out = []
    for r in rows:
        if headlines_only and HEADLINES.get(r.claim.capability) != r.claim.key:
            continue
        c, f = r.claim, fields(r)
        if r.problem:
            out.append(f"- **{c.capability}**: {c.claim}: missing ({r.problem})")
            continue
        vs = (f" vs {f['opponent']} {f['opponent_value']}: {f['ratio']}"
              + (f" (per run {f['ratio_spread']})" if f["ratio_spread"] != "—" else "")
              if r.opponent else ", no opponent in this result")
        goal = f"; goal {r.goal}" if r.goal else ""
        sim = ", ".join(c.simulated) or "nothing"
        spread = f" [{f['spread']}]" if f["spread"] != f["value"] else ""
        out.append(f"- **{c.capability}**: {c.claim}: seamguard {f['value']}{spread}{vs} "
                   f"({c.better} is better), n {f['n']}{goal}; simulated: {sim}; "
                   f"`{c.results}` (run: {r.run}; commit: {r.commit}; load: {r.load})")
    return "\n".join(out)


BLOCK = re.compile(r"(<!-- claims:(table|lines|capabilities) begin -->\n)(.*?)(<!-- claims:\2 end -->)", re.S)
INLINE = re.compile(r"(<!-- claim:([a-z0-9_]+):([a-z_]+) -->)(.*?)(<!-- /claim -->)", re.S)


def render_doc(text: str, rows: list[Row], where: str) -> str:
    """The doc with every generated block and inline figure regenerated; a marker that is
    unbalanced or names an unknown claim or field is a ClaimError naming the doc."""
    if text.count("<!-- claims:") != 2 * len(BLOCK.findall(text)):
        raise ClaimError(f"{where}: a claims block marker without its pair")
    if text.count("<!-- claim:") != len(INLINE.findall(text)):
        raise ClaimError(f"{where}: an inline claim marker without <!-- /claim -->")
    by_key = {r.claim.key: fields(r) for r in rows}
    rendered = {"table": render_table(rows), "lines": render_lines(rows),
                "capabilities": render_lines(rows, headlines_only=True)}

    def inline(m: re.Match) -> str:
        key, name = m.group(2), m.group(3)
        if key not in by_key or name not in by_key[key]:
            raise ClaimError(f"{where}: inline marker names unknown claim field {key}:{name}")
        return m.group(1) + by_key[key][name] + m.group(5)

    text = BLOCK.sub(lambda m: m.group(1) + rendered[m.group(2)] + "\n" + m.group(4), text)
    return INLINE.sub(inline, text)


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def check_doc(path: Path, rows: list[Row]) -> list[str]:
    """What in ``path`` disagrees with the table (empty when it agrees)."""
    text = path.read_text()
    name = _name(path)
    if not BLOCK.search(text):
        return [f"{name}: no <!-- claims:table begin --> block"]
    want = render_doc(text, rows, name)
    if want == text:
        return []
    got_lines, want_lines = text.splitlines(), want.splitlines()
    diffs = [f"{name}:{i + 1}: has {g.strip()[:160]!r}, the results give {w.strip()[:160]!r}"
             for i, (g, w) in enumerate(zip(got_lines, want_lines)) if g != w]
    return diffs or [f"{name}: the generated block differs in length from the results'"]


#: A measured-looking figure written by hand: a number with a result's unit (s, ms, ×,
#: requests/s) that is not a goal (after ≤, ≥ or "goal of", or before "goal").
BARE = re.compile(r"(?<![\w.=≤≥])(?<!≤ )(?<!≥ )(?<!goal of )(\d[\d,]*(?:\.\d+)?)"
                  r"\s?(?:×|s\b|ms\b|req(?:uests)?/s\b)(?!\s+goal)")
FENCE = re.compile(r"```.*?```", re.S)


#: A docs/benchmarks.md paragraph opening with this is a headline line: checked like the README's.
HEADLINE_LEAD = "One line a skeptic can repeat"


def unmarked_figures(text: str, where: str, lead: str | None = None) -> list[str]:
    """Figures written by hand in a paragraph that quotes the table. The markers' check
    cannot see them, so a stale one would pass: a paragraph with a claim marker (only those
    opening with ``lead``, when given) carries no other measured figure (sizes, loads and
    goals have no result's unit or follow ≤/≥). One line per figure, naming the doc and line."""
    out = []
    clean = BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text))
    line = 1
    for para in re.split(r"(\n\s*\n)", clean):
        if "<!-- claim:" in para and (lead is None or para.lstrip().startswith(lead)):
            bare = INLINE.sub(lambda m: "\n" * m.group(0).count("\n"), para)
            out += [f"{where}:{line + bare[:m.start()].count(chr(10))}: a figure written by hand beside the "
                    f"table's, {m.group(0)!r}: quote it with <!-- claim:KEY:FIELD --> or leave it out"
                    for m in BARE.finditer(bare)]
        line += para.count("\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="regenerate the blocks in README.md and docs/benchmarks.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if a doc's figure disagrees with the table")
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="results folder (default: benchmarks/results)")
    args = ap.parse_args(argv)
    rows = build_table(CLAIMS, args.results)
    print(render_table(rows))
    problems = [r.problem for r in rows if r.problem]
    disagreements: list[str] = []
    try:
        if args.write:
            new = {p: render_doc(p.read_text(), rows, _name(p)) for p in DOCS}
            for p, text in new.items():   # every doc validated before any is written
                if text != p.read_text():
                    p.write_text(text)
        if args.check:
            disagreements = [d for p in DOCS for d in check_doc(p, rows)]
            disagreements += unmarked_figures(DOCS[0].read_text(), _name(DOCS[0]))
            disagreements += unmarked_figures(DOCS[1].read_text(), _name(DOCS[1]), HEADLINE_LEAD)
    except ClaimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for d in problems + disagreements:
        print(d, file=sys.stderr)
    ok = not (args.check and (problems or disagreements))
    print(json.dumps({"claims": len(rows), "missing": len(problems), "disagreements": len(disagreements),
                      "ok": ok, "rows": [dict(key=r.claim.key, **fields(r), goal=r.goal, commit=r.commit,
                                              run=r.run, load=r.load) for r in rows]}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
