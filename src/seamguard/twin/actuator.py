"""The twin as an actuator: the controller's actions change the simulated world.

Drains evacuate a node's ranks to a spare after a checkpoint, labels keep the scheduler
from placing work that would suffer, checkpoints commit progress, avoided links leave
the ECMP group, avoided storage paths stop taking checkpoints, and moved jobs trade
their nodes on a failing cooling loop for spares or for nodes of less critical,
less synchronous work elsewhere.
"""

from __future__ import annotations

import numpy as np

from seamguard.act.base import ActionResult, verb_of
from seamguard.decide.actions import Action, ActionKey, Verb
from seamguard.fleet.model import JOB_CLASS_SYNCHRONY, Kind
from seamguard.twin.telemetry import Twin


class TwinActuator:
    name = "twin"
    verbs = frozenset(Verb)

    def __init__(self, twin: Twin) -> None:
        self.twin = twin
        self.held: set[str] = set()

    def observe(self) -> set[str]:
        return set(self.held)

    def apply(self, action: Action) -> ActionResult:
        tw, f = self.twin, self.twin.fleet
        try:
            kind = {"node": Kind.NODE, "job": Kind.JOB, "link": Kind.LINK, "storage": Kind.STORAGE}[action.target_kind]
            i = f.index_of(kind, action.target)
        except KeyError as e:
            return ActionResult(False, str(e))
        detail = ""
        if action.verb == Verb.DRAIN:
            tw.node_drained[i] = True
            detail = self._evacuate(i)
        elif action.verb == Verb.LABEL_DEGRADED:
            tw.node_labels[i] = tuple(action.param("classes").split(","))
        elif action.verb == Verb.CHECKPOINT_NOW:
            if tw.jobs.busy_until_s[i] <= tw.t_s:
                tw.checkpoint_job(i)
                detail = f"checkpointed at t={tw.t_s:.0f}s"
            else:
                detail = "job busy (checkpointing or restarting): its next commit covers it"
        elif action.verb == Verb.AVOID_LINK:
            tw.link_avoided[i] = True
        elif action.verb == Verb.AVOID_STORAGE:
            tw.storage_avoided[i] = True
        elif action.verb == Verb.MOVE_JOB:
            detail = self._move_off_loop(i, f.index_of(Kind.COOLING_LOOP, action.param("domain")))
        elif action.verb == Verb.CHECKPOINT_INTERVAL:
            self.held -= {k for k in self.held if verb_of(k) == Verb.CHECKPOINT_INTERVAL
                          and ActionKey.parse(k).entity == action.target}  # one interval per job
            tw.job_interval_s[i] = float(action.param("interval_s"))
        self.held.add(action.key)
        tw.events.append({"t_s": tw.t_s, "event": action.verb.value, "target": action.target, "detail": detail})
        return ActionResult(True, detail)

    def revert(self, key: str) -> ActionResult:
        tw, f = self.twin, self.twin.fleet
        verb = verb_of(key)
        target = ActionKey.parse(key).entity
        if verb == Verb.DRAIN:
            tw.node_drained[f.index_of(Kind.NODE, target)] = False
        elif verb == Verb.LABEL_DEGRADED:
            tw.node_labels.pop(f.index_of(Kind.NODE, target), None)
        elif verb == Verb.AVOID_LINK:
            tw.link_avoided[f.index_of(Kind.LINK, target)] = False
        elif verb == Verb.AVOID_STORAGE:
            tw.storage_avoided[f.index_of(Kind.STORAGE, target)] = False
        elif verb == Verb.CHECKPOINT_INTERVAL and key in self.held:  # not one a newer interval replaced
            tw.job_interval_s[f.index_of(Kind.JOB, target)] = np.nan
        self.held.discard(key)
        tw.events.append({"t_s": tw.t_s, "event": f"revert_{verb.value}", "target": target})
        return ActionResult(True)

    # ---- scheduling moves -------------------------------------------------------------
    def _evacuate(self, node: int) -> str:
        tw, f = self.twin, self.twin.fleet
        j = int(tw.node_job()[node])
        if j < 0:
            return "idle node drained"
        spares = tw.free_nodes(avoid_loop=int(f.node_loop[node]))
        if spares.size == 0:
            spares = tw.free_nodes()
        if spares.size == 0:
            return "no spare node: the job keeps running here until one frees up"
        tw.checkpoint_job(j)
        tw.move_node_work(node, int(spares[0]))
        tw.pause_job(j, tw.cfg.migrate_s, rollback=False)
        return f"ranks moved to {f.node_names[int(spares[0])]}"

    def _move_off_loop(self, job: int, loop: int) -> str:
        tw, f = self.twin, self.twin.fleet
        node_job = tw.node_job()
        mine = np.flatnonzero((node_job == job) & (f.node_loop == loop))
        if mine.size == 0:
            return "job already off the loop"
        # Candidates: free nodes off the loop, then nodes of work that tolerates the loop
        # better (lower synchrony, lower criticality) off the loop.
        free = list(tw.free_nodes(avoid_loop=loop))
        sync = JOB_CLASS_SYNCHRONY[f.job_class]
        other = np.flatnonzero((node_job >= 0) & (node_job != job) & (f.node_loop != loop) & ~tw.node_drained)
        tolerant = [n for n in other.tolist()
                    if sync[node_job[n]] < sync[job] and f.job_criticality[node_job[n]] < f.job_criticality[job]]
        moved, swapped = 0, set()
        tw.checkpoint_job(job)
        for n in mine.tolist():
            if free:
                dst = int(free.pop(0))
            elif tolerant:
                dst = tolerant.pop(0)
                swapped.add(int(node_job[dst]))
            else:
                break
            tw.move_node_work(n, dst)
            moved += 1
        tw.pause_job(job, tw.cfg.migrate_s, rollback=False)
        for other_job in swapped:
            tw.pause_job(other_job, tw.cfg.migrate_s, rollback=False)
        return f"moved {moved} of {mine.size} nodes off {f.loop_names[loop]}" + \
            (f" (swapped with {', '.join(f.job_names[o] for o in sorted(swapped))})" if swapped else "")
