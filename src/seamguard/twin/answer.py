"""Everything `twin simulate --calibrated` answers, computed once for the CLI and the service. Pure.

Why this file exists: the CLI (app/twin_calibrate.py) and `GET /api/v1/twin/whatif`
(app/service/whatif.py) must give the same answers from the same calibrated document: the fleet
ETTR of the twin's seamguard policy on the calibrated failures, each job's checkpoint interval,
tier, hot spares and release-slip probability (twin/calibrated.py), and the policy what-ifs on
the window's replayed faults (twin/whatif.py), each with intervals. It also turns a topology into
what calibration divides by (`fleet_exposure`) and what it knows of each job (`fleet_jobs`).
A caller's ``stop`` bounds the work: what was done when it says stop is reported, with counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from seamguard.fleet.model import Kind
from seamguard.twin.calibrated import PEER_STALL_FACTOR, JobAsk, failure_model, recommend
from seamguard.twin.events.calibration import llama3_failure_model
from seamguard.twin.events.config import ClusterConfig, PolicyParams
from seamguard.twin.events.measured import DEFAULT_FIGURES
from seamguard.twin.events.simulator import simulate_run
from seamguard.twin.whatif import Variant, whatif

__all__ = ["answer", "fleet_exposure", "fleet_jobs", "job_asks", "job_tiers", "tiers_s"]

_KINDS_SKIPPED = ("job", "rack")  # a job is not failure-prone hardware; a rack fails as its nodes, loop or feed


def fleet_exposure(fleet) -> dict[str, int]:
    """Entities of each failure domain in the topology (what a rate is per)."""
    return {k.label: fleet.count(k) for k in Kind if k.label not in _KINDS_SKIPPED}


def fleet_jobs(fleet, t1: float) -> dict[str, dict]:
    """What the topology says of each job: GPUs, deadline (from ``t1``), total steps, step time."""
    deadline, total, step = fleet.job_schedule()
    gpus = fleet.job_gpu_count
    return {name: {"gpus_in_topology": int(gpus[i]), "deadline_in_s": float(deadline[i] - t1),
                   "total_steps": float(total[i]), "step_s": float(step[i])} for i, name in enumerate(fleet.job_names)}


def tiers_s(doc: Mapping, state_gib_per_gpu: float, checkpoint_write_min: float) -> dict[str, tuple[float, float]]:
    """(write stall s, restore s) of the storage and peer-memory tiers: the runtime's measured rates
    where the config has them (else the twin's defaults), the storage write from ``checkpoint_write_min``."""
    ck, figs = doc["checkpoint"], DEFAULT_FIGURES
    if ck.get("source") == "measured":
        figs = replace(figs, save_s_per_gib=ck["save_s_per_gib"], restore_s_per_gib=ck["restore_s_per_gib"],
                       snapshot_stall_ratio=ck["snapshot_stall_ratio"])
    pp = PolicyParams("seamguard", checkpoint_write_min=checkpoint_write_min, state_gib_per_gpu=state_gib_per_gpu,
                      runtime=figs)
    return {"storage": (pp.full_write_s, pp.full_write_s),
            "peer_memory": (PEER_STALL_FACTOR * pp.in_memory_stall_s, pp.in_memory_restore_s)}


def job_tiers(doc: Mapping, base: dict[str, tuple[float, float]]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per job, the tiers with its own measured snapshot stall (median) as the peer-memory write, where it has one."""
    out = {}
    for name, j in doc["jobs"].items():
        st = j.get("snapshot_stall") or {}
        out[name] = ({**base, "peer_memory": (float(st["p50_s"]), base["peer_memory"][1])}
                     if st.get("source") == "measured" else base)
    return out


def job_asks(doc: Mapping) -> list[JobAsk]:
    """The jobs the questions are asked about: those with GPUs in the document."""
    out = []
    for name, j in doc["jobs"].items():
        gpus = int(j.get("gpus_in_topology") or j.get("gpus") or 0)
        if gpus <= 0:
            continue
        total, step = j.get("total_steps"), j.get("step_s")
        # progress is not in the history: the time the job ran in the window bounds the steps it did
        work = total * step - j.get("run_h", 0.0) * 3600.0 if total and step else math.nan
        out.append(JobAsk(name, gpus, max(work, 0.0) if math.isfinite(work) else math.nan,
                          j.get("deadline_in_s") if j.get("deadline_in_s") is not None else math.nan))
    return out


def _fleet(doc: Mapping) -> ClusterConfig:
    gpus = int(next((h["entities"] for h in doc["hazards"] if h["domain"] == "gpu" and h.get("entities")), 0))
    if gpus <= 0:
        raise ValueError("no GPUs in it (calibrate with a topology that has GPUs)")
    return ClusterConfig(gpus=max(gpus - gpus % 8, 8), days=float(doc["window"]["days"]), workload="mix",
                         failures=llama3_failure_model())


def answer(doc: Mapping, *, draws: int, seeds: int, seed: int, policy: PolicyParams,
           state_gib_per_gpu: float = 28.0, checkpoint_write_min: float = 5.0,
           variants: Sequence[Variant] | None = None, stop: Callable[[], bool] | None = None) -> dict:
    """Fleet ETTR, per-job advice and (with ``variants``) the what-ifs, each [2.5 %, median, 97.5 %] over
    ``draws`` parameter draws x ``seeds`` seeds; ValueError (one line) when the document holds no fleet."""
    base = _fleet(doc)
    asks = job_asks(doc)
    if not asks:
        raise ValueError("no job with GPUs in it (calibrate with a topology that has jobs)")
    rng = np.random.default_rng(seed)
    ettr = []
    for d in range(draws):
        if stop is not None and stop():
            break
        cfg = replace(base, failures=failure_model(doc, base.failures, rng))
        ettr += [simulate_run(cfg, policy, ss).ettr for ss in np.random.SeedSequence(seed + d).spawn(seeds)]
    tiers = job_tiers(doc, tiers_s(doc, state_gib_per_gpu, checkpoint_write_min))
    jobs = [r for a in asks for r in recommend(doc, [a], tiers[a.name], base.horizon_s, draws, seeds, rng)]
    what = whatif(doc, base, variants, policy, draws, seeds, seed, stop) if variants else None
    return {"gpus": base.gpus, "days": base.days, "draws": draws, "seeds": seeds,
            "fleet_ettr": np.quantile(ettr, [0.025, 0.5, 0.975]).tolist() if ettr else None,
            "detection": (policy.detection.source if policy.detection is not None
                          else {"delay_s": policy.detection_delay_s}),
            "jobs": jobs, "whatif": what,
            "priors_used": [f"{h['domain']}/{h['class']}" for h in doc["hazards"] if h.get("source") == "prior"]}
