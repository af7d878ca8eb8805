"""The Slurm actuator: drains, admissibility features, no-new-work reservations and job moves.

Drains, resumes and features go through scontrol/sinfo here; moving (or shedding) a job
off a degraded domain and the per-node reservations are in act/slurm_jobs.py.

Level-triggered: `observe()` reads the cluster's actual state back with `sinfo` and
reports only what seamguard owns — drains whose reason carries the owner tag
(`seamguard: <state> <evidence>`, the LBNL NHC convention) and features with the
seamguard prefix. It never resumes a node someone else drained and never overwrites
another owner's drain reason. Every call has a timeout; what Slurm refuses (rc != 0)
comes back as ActionResult(ok=False, detail=stderr).

Output is parsed strictly but never trusted: the drain reason is free text (another
owner may write `|` into it), so it is the last field and the line is split at most
four times; a row that still does not parse (garbage, a reason with a newline) is
dropped with a warning and listed in `problems`, the other rows are used. Every call
runs in its own process group with one deadline (`timeout_s`) and a bound on what it
may print (`max_output_bytes`): a hung `sinfo`, and anything it spawned, is killed.
Bytes that are not UTF-8 are replaced, never raised. (`sinfo --json` needs Slurm's
serializer plugins, absent from the Debian 22.05 packages, so the text format is
what every version answers.)

Slurm 22.05 quirk (docs/sources.md §2, observed against a real slurmctld): RESUME on a node that never registered
(no slurmd) clears DRAIN but exits 1 with "Invalid node state specified"; the result
is decided by reading the state back, not by the exit code.
"""

from __future__ import annotations

import logging
import os
import re
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from seamguard.act.base import ActionResult, label_value, verb_of
from seamguard.act.slurm_jobs import SlurmJobs
from seamguard.assess.admissibility import ADMISSIBILITY_COLUMNS
from seamguard.decide.actions import Action, ActionKey, Verb, action_key

log = logging.getLogger("seamguard.act.slurm")

_SEP = "|"
# sinfo fields: node, long state, available features, active features, and the reason
# last: it is free text and may itself contain the separator.
_SINFO_FORMAT = _SEP.join(["%N", "%T", "%f", "%b", "%E"])
_NAME = re.compile(r"^[^\s|,]+$")
_STATE = re.compile(r"^[a-z_+*~#$@%!^-]+$")


class SlurmConfig(BaseModel):
    """The `slurm` actuator section of a run config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scontrol: str = Field("scontrol", description="scontrol binary")
    sinfo: str = Field("sinfo", description="sinfo binary")
    squeue: str = Field("squeue", description="squeue binary (job moves)")
    scancel: str = Field("scancel", description="scancel binary (the checkpoint signal of a job move)")
    slurm_conf: Path | None = Field(None, description="SLURM_CONF for the calls (default: Slurm's own)")
    timeout_s: float = Field(15.0, gt=0, description="timeout of every scontrol/sinfo call")
    tag: str = Field("seamguard", min_length=1, description="owner tag: drain reasons start with '<tag>:'")
    feature_prefix: str = Field("sg_", min_length=1, description="prefix of seamguard's node features")
    max_reason_len: int = Field(200, ge=32, description="drain reasons are cut to this length")
    max_output_bytes: int = Field(64 * 1024 * 1024, ge=1024,
                                  description="a call printing more than this is killed and counted as failed")
    move_jobs: bool = Field(True, description="act on move_job (moves and sheds): checkpoint, then requeue the "
                                              "job with the domain's nodes excluded; false: not handled here")
    checkpoint_signal: str = Field("", pattern=r"^([A-Z0-9]+)?$",
                                   description="signal asking a job to checkpoint before it is requeued "
                                               "(scancel --signal --full), e.g. USR1; empty (default): none, "
                                               "since a job that does not handle it dies of it")
    checkpoint_grace_s: float = Field(60.0, ge=0, description="time between the checkpoint signal and the requeue")
    reserve_no_new_work: bool = Field(True, description="a node labelled for no job class also gets a "
                                                        "Flags=MAINT reservation, so no new job starts there")


class SlurmError(RuntimeError):
    """sinfo/scontrol could not be run or answered nonsense; ``retryable`` if a retry may help."""

    def __init__(self, msg: str, retryable: bool) -> None:
        super().__init__(msg)
        self.retryable = retryable


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # sinfo %T, lower case (e.g. idle, drained, draining, down)
    reason: str
    available: tuple[str, ...]
    active: tuple[str, ...]

    @property
    def draining(self) -> bool:
        return "drain" in self.state  # drained, draining, idle+drain, ...


def _features(field: str) -> tuple[str, ...]:
    return tuple(f for f in field.strip().split(",") if f and f != "(null)")


def parse_sinfo(text: str) -> tuple[dict[str, NodeInfo], list[str]]:
    """``sinfo -N -h -o "%N|%T|%f|%b|%E"`` -> (nodes by name, problems). Pure; never raises.

    The reason is last and may contain ``|``; a row whose name or state does not look
    like one (garbage, the tail of a reason that had a newline) is a problem, not a node.
    """
    out: dict[str, NodeInfo] = {}
    problems: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(_SEP, 4)
        if len(parts) != 5:
            problems.append(f"cannot parse row {line[:200]!r}")
            continue
        name, state, avail, active, reason = parts
        name, state = name.strip(), state.strip().lower()
        if not _NAME.match(name) or not _STATE.match(state):
            problems.append(f"not a node row {line[:200]!r}")
            continue
        reason = reason.strip()
        # A node in several partitions appears once per partition; the rows agree.
        out[name] = NodeInfo(name, state, "" if reason == "none" else reason, _features(avail), _features(active))
    return out, problems


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a command and everything it started (its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        log.error("pid %d did not exit after SIGKILL", proc.pid)


class SlurmActuator:
    name = "slurm"

    def __init__(self, cfg: SlurmConfig | None = None) -> None:
        self.cfg = cfg or SlurmConfig()
        self.verbs = frozenset({Verb.DRAIN, Verb.LABEL_DEGRADED} | ({Verb.MOVE_JOB} if self.cfg.move_jobs else set()))
        self._env = dict(os.environ)
        if self.cfg.slurm_conf is not None:
            self._env["SLURM_CONF"] = str(self.cfg.slurm_conf)
        self.problems: list[str] = []  # rows the last sinfo read dropped, and why
        self.jobs = SlurmJobs(self._run, self.cfg.scontrol, self.cfg.squeue, self.cfg.scancel, self.cfg.tag,
                              self.cfg.feature_prefix, self.cfg.checkpoint_signal, self.cfg.checkpoint_grace_s)

    # ---- subprocess --------------------------------------------------------------------
    def _run(self, args: list[str]) -> subprocess.CompletedProcess:
        """Run one Slurm command with one deadline and bounded output; raises SlurmError."""
        what = " ".join(args[:3])
        try:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=self._env, start_new_session=True)
        except OSError as e:
            raise SlurmError(f"cannot run {args[0]}: {e.strerror}", False) from None
        deadline = time.monotonic() + self.cfg.timeout_s
        assert proc.stdout is not None and proc.stderr is not None
        fd_out, fd_err = proc.stdout.fileno(), proc.stderr.fileno()
        bufs: dict[int, bytearray] = {fd_out: bytearray(), fd_err: bytearray()}
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                sel.register(proc.stderr, selectors.EVENT_READ)
                total = 0
                while sel.get_map():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise SlurmError(f"{what}: no answer within {self.cfg.timeout_s:g}s", True)
                    for key, _ in sel.select(remaining):
                        chunk = os.read(key.fd, 65536)
                        if not chunk:
                            sel.unregister(key.fileobj)
                            continue
                        bufs[key.fd] += chunk
                        total += len(chunk)
                        if total > self.cfg.max_output_bytes:
                            raise SlurmError(f"{what}: printed more than {self.cfg.max_output_bytes} bytes; "
                                             "killed", False)
            try:
                rc = proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                raise SlurmError(f"{what}: no answer within {self.cfg.timeout_s:g}s", True) from None
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            proc.stdout.close()
            proc.stderr.close()
        return subprocess.CompletedProcess(args, rc, bufs[fd_out].decode("utf-8", "replace"),
                                           bufs[fd_err].decode("utf-8", "replace"))

    def nodes(self) -> dict[str, NodeInfo]:
        """Actual state of every node, read from sinfo (one row per node).

        Rows that do not parse are dropped (warned, listed in ``problems``); if sinfo
        printed something and no row parses, that is an error, not an empty cluster."""
        r = self._run([self.cfg.sinfo, "-N", "-h", "-o", _SINFO_FORMAT])
        if r.returncode != 0:
            # slurmctld down or busy is worth retrying; a bad flag is not, but looks the same here.
            raise SlurmError(f"sinfo failed (rc {r.returncode}): {r.stderr.strip()[:500]}", True)
        out, problems = parse_sinfo(r.stdout)
        self.problems = problems
        if problems:
            log.warning("sinfo: %d row(s) dropped; first: %s", len(problems), problems[0])
            if not out:
                raise SlurmError(f"sinfo: no row could be parsed ({problems[0]})", True)
        return out

    def _owned(self, reason: str) -> bool:
        return reason.startswith(self.cfg.tag + ":")

    def _own_features(self, feats: tuple[str, ...]) -> list[str]:
        return [f for f in feats if f.startswith(self.cfg.feature_prefix)]

    def _classes_from(self, feats: tuple[str, ...]) -> list[str]:
        ok = self.cfg.feature_prefix + "ok_"
        have = {f[len(ok):] for f in feats if f.startswith(ok)}
        return [c for c in ADMISSIBILITY_COLUMNS if c in have]

    # ---- Actuator protocol -----------------------------------------------------------------
    def observe(self) -> set[str]:
        held: set[str] = set()
        nodes = self.nodes()  # sinfo first: an unusable sinfo is the error to report
        try:
            reserved = set(self.jobs.reservations().values()) if self.cfg.reserve_no_new_work else set()
        except RuntimeError as e:
            raise SlurmError(f"cannot read reservations: {e}", True) from None
        for n in nodes.values():
            if n.draining and self._owned(n.reason):
                held.add(action_key(Verb.DRAIN, n.name))
            if self.cfg.feature_prefix + "degraded" in n.available:
                value = label_value(self._classes_from(n.available))  # the planner's spelling
                if value != "none" or not self.cfg.reserve_no_new_work or n.name in reserved:
                    held.add(action_key(Verb.LABEL_DEGRADED, n.name, value=value))
        if self.cfg.move_jobs:
            held |= self.jobs.held_moves()
        return held

    def apply(self, action: Action) -> ActionResult:
        if action.verb == Verb.DRAIN:
            return self._drain(action)
        if action.verb == Verb.LABEL_DEGRADED:
            classes = [c for c in action.param("classes").split(",") if c]
            return self._label(action.target, classes, ActionKey.parse(action.key).value == "none")
        if action.verb == Verb.MOVE_JOB and self.cfg.move_jobs:
            return self._guard(lambda: self.jobs.move(action))
        return ActionResult(False, f"slurm actuator does not handle {action.verb.value}")

    def revert(self, key: str) -> ActionResult:
        verb = verb_of(key)
        target = ActionKey.parse(key).entity
        if verb == Verb.DRAIN:
            return self._resume(target)
        if verb == Verb.LABEL_DEGRADED:
            return self._label(target, None, False)
        if verb == Verb.MOVE_JOB and self.cfg.move_jobs:
            return self._guard(lambda: self.jobs.unmove(key))
        return ActionResult(False, f"slurm actuator does not handle {verb.value}")

    @staticmethod
    def _guard(fn) -> ActionResult:
        """A job/reservation call: a Slurm refusal is permanent, a timeout or a dead slurmctld is retried."""
        try:
            return fn()
        except SlurmError as e:
            return ActionResult(False, str(e), retryable=e.retryable)
        except RuntimeError as e:
            return ActionResult(False, str(e))

    def _label(self, node: str, classes: list[str] | None, no_new_work: bool) -> ActionResult:
        """Features, and for a node that may take no job class at all, the no-new-work reservation."""
        res = self._set_features(node, classes)
        if not res.ok or not self.cfg.reserve_no_new_work:
            return res
        more = self._guard(lambda: ActionResult(True, self.jobs.reserve(node, no_new_work)))
        return ActionResult(more.ok, f"{res.detail}; {more.detail}", more.retryable)

    # ---- verbs ----------------------------------------------------------------------------------
    def reason_for(self, action: Action) -> str:
        text = " ".join(action.reason.split())  # one line, single spaces
        tag = self.cfg.tag + ":"
        if not text.startswith(tag):
            text = f"{tag} {text.split(':', 1)[1].strip() if text.startswith('seamguard:') else text}"
        return text[: self.cfg.max_reason_len]

    def _node(self, name: str) -> NodeInfo | None:
        return self.nodes().get(name)

    def _drain(self, action: Action) -> ActionResult:
        try:
            cur = self._node(action.target)
            if cur is None:
                return ActionResult(False, f"slurm has no node {action.target!r}")
            if cur.draining and not self._owned(cur.reason):
                # Someone else's drain: leave it and its reason alone (we would otherwise
                # take ownership and later resume a node we were never allowed to touch).
                return ActionResult(True, f"already drained by another owner ({cur.reason!r}); left as is")
            reason = self.reason_for(action)
            r = self._run([self.cfg.scontrol, "update", f"NodeName={action.target}", "State=DRAIN",
                           f"Reason={reason}"])
        except SlurmError as e:
            return ActionResult(False, str(e), retryable=e.retryable)
        if r.returncode != 0:
            return ActionResult(False, f"scontrol refused drain (rc {r.returncode}): {r.stderr.strip()}")
        return ActionResult(True, f"drained: {reason}")

    def _resume(self, node: str) -> ActionResult:
        try:
            cur = self._node(node)
            if cur is None:
                return ActionResult(False, f"slurm has no node {node!r}")
            if not cur.draining:
                return ActionResult(True, "not drained")
            if not self._owned(cur.reason):
                return ActionResult(False, f"refusing to resume {node}: drained by another owner ({cur.reason!r})")
            r = self._run([self.cfg.scontrol, "update", f"NodeName={node}", "State=RESUME"])
            if r.returncode == 0:
                return ActionResult(True, "resumed")
            after = self._node(node)  # 22.05: RESUME of a never-registered node clears DRAIN, rc 1
        except SlurmError as e:
            return ActionResult(False, str(e), retryable=e.retryable)
        if after is not None and not after.draining:
            return ActionResult(True, f"resumed (scontrol rc {r.returncode}: {r.stderr.strip()}; "
                                      f"state read back: {after.state})")
        return ActionResult(False, f"scontrol refused resume (rc {r.returncode}): {r.stderr.strip()}")

    def _set_features(self, node: str, classes: list[str] | None) -> ActionResult:
        """Replace seamguard's features on ``node`` (None removes them), keeping everyone else's."""
        try:
            cur = self._node(node)
            if cur is None:
                return ActionResult(False, f"slurm has no node {node!r}")
            p = self.cfg.feature_prefix
            keep_avail = [f for f in cur.available if not f.startswith(p)]
            keep_active = [f for f in cur.active if not f.startswith(p)]
            ours = [] if classes is None else [f"{p}degraded"] + [f"{p}ok_{c}" for c in classes]
            avail = ",".join(keep_avail + ours)
            active = ",".join(keep_active + ours)
            r = self._run([self.cfg.scontrol, "update", f"NodeName={node}", f"AvailableFeatures={avail}",
                           f"ActiveFeatures={active}"])
        except SlurmError as e:
            return ActionResult(False, str(e), retryable=e.retryable)
        if r.returncode != 0:
            return ActionResult(False, f"scontrol refused features (rc {r.returncode}): {r.stderr.strip()}")
        return ActionResult(True, f"features: {avail or '(none)'}")
