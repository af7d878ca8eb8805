"""Slurm job moves and per-node reservations: the parts of the Slurm actuator that touch jobs.

`SlurmActuator` (act/slurm.py) calls these; they are split out so each file says one
thing. Two mechanisms:

**move_job** (``move_job:<job>@<domain>``; also what the planner's shedding decides, see
docs/policy.md): the Slurm jobs named ``<job>`` leave the domain's nodes and do not come
back while the key is held. A running job on the domain goes through two phases, one per
controller tick, so nothing blocks a tick:

1. *asked*: seamguard's token is written into the job's AdminComment and, if one is
   configured, the job is sent ``checkpoint_signal`` (`scancel --signal=USR1 --full`:
   batch shell and steps; off by default, since a process that does not handle the signal
   dies of it). A job run by `seamguard launch` gets the runtime's checkpoint_now hint,
   which the reconciler applies before moves. The token records when. Whatever the
   signal, the requeue itself sends SIGTERM and waits KillWait before SIGKILL.
2. *moved*: once ``checkpoint_grace_s`` has passed, `scontrol requeuehold` (the job is
   killed after KillWait and held), `scontrol update ExcNodeList=<existing + domain>`
   (Slurm refuses ExcNodeList on a running job, hence the hold), the domain's nodes
   dropped from ReqNodeList, then `scontrol release`. Slurm starts it elsewhere once
   the requeued job's BeginTime (cred_expire, default 120 s) has passed.

The token, ``<tag>:<key>;<phase>=<unix s>;exc=<nodes seamguard added>``, is the first
word of AdminComment (anything an administrator wrote there is kept after it): a restarted
controller reads its own work back from Slurm. A key is in effect when a live job carries
its token in phase *moved*. Reverting removes the token and only the excluded nodes
seamguard added, so the job may use the domain again if it is ever requeued.

**No new work on a node** (``label_degraded:<node>=none``): besides the features, a
reservation ``<feature_prefix>nonew_<node>`` (`Flags=MAINT,IGNORE_JOBS`, `Users=root`,
infinite): running jobs keep running, no new job starts there unless it asks for the
reservation. Its name is the ownership mark; it is deleted on revert.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from seamguard.act.base import ActionResult
from seamguard.decide.actions import Action, ActionKey, Verb

# Job states in which a job still holds or may get nodes (squeue's default set, spelled out).
_LIVE_STATES = "PENDING,RUNNING,CONFIGURING,COMPLETING,REQUEUED,REQUEUE_HOLD,REQUEUE_FED,RESIZING,SUSPENDED"
_FIELD = re.compile(r"(?:^|\s)([A-Za-z]+)=(\S*)")


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    name: str
    state: str  # JobState, upper case
    nodes: tuple[str, ...]  # NodeList, expanded
    excluded: tuple[str, ...]  # ExcNodeList, expanded
    required: tuple[str, ...]  # ReqNodeList, expanded
    admin_comment: str  # first word only: ours is written first

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "CONFIGURING", "SUSPENDED")


@dataclass(frozen=True)
class Token:
    """seamguard's mark on a job: the key, the phase reached and when, the nodes it excluded."""

    key: str
    phase: str  # asked | moved
    t_s: float
    excluded: tuple[str, ...]

    def render(self, tag: str) -> str:
        return f"{tag}:{self.key};{self.phase}={int(self.t_s)};exc={','.join(self.excluded)}"


def parse_token(word: str, tag: str) -> Token | None:
    """Our token from the first word of an AdminComment; None if the word is not ours. Pure."""
    if not word.startswith(tag + ":"):
        return None
    key, *parts = word[len(tag) + 1:].split(";")
    fields = dict(p.partition("=")[::2] for p in parts)
    phase = next((p for p in ("moved", "asked") if p in fields), "")
    try:
        ak = ActionKey.parse(key)
        t_s = float(fields[phase])
    except (ValueError, KeyError):
        return None
    if ak.verb != Verb.MOVE_JOB:
        return None
    return Token(key, phase, t_s, tuple(n for n in fields.get("exc", "").split(",") if n))


def parse_show_job(text: str) -> dict[str, str]:
    """One line of ``scontrol show job -o`` -> its fields (a value is its first word). Pure.

    Free-text fields (AdminComment, Comment, Command) may contain spaces; only the first
    word of each is kept, which is all this module reads (our token is written first).
    """
    out: dict[str, str] = {}
    for m in _FIELD.finditer(text):
        out.setdefault(m.group(1), m.group(2))
    return out


def hostlist_words(text: str) -> list[str]:
    """A Slurm node list field as the words `scontrol show hostnames` takes; '(null)' and '' are none."""
    return [] if text in ("", "(null)", "None") else [text]


class SlurmJobs:
    """Move, shed and reserve through one ``run`` (the actuator's bounded scontrol/squeue caller)."""

    def __init__(self, run: Callable[[list[str]], subprocess.CompletedProcess], scontrol: str, squeue: str, scancel: str, tag: str,
                 prefix: str, checkpoint_signal: str, checkpoint_grace_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._run, self.scontrol, self.squeue, self.scancel = run, scontrol, squeue, scancel
        self.tag, self.prefix = tag, prefix
        self.signal, self.grace_s, self.clock = checkpoint_signal, checkpoint_grace_s, clock

    def _ok(self, args: list[str]) -> str:
        """Run; stdout, or raise RuntimeError with Slurm's stderr (a refusal, not retried)."""
        r = self._run(args)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:3])} refused (rc {r.returncode}): {r.stderr.strip()[:300]}")
        return r.stdout

    def expand(self, nodelist: str) -> tuple[str, ...]:
        words = hostlist_words(nodelist)
        return tuple(self._ok([self.scontrol, "show", "hostnames", *words]).split()) if words else ()

    # ---- reading ---------------------------------------------------------------------------
    def job_ids(self, name: str | None = None) -> list[str]:
        args = [self.squeue, "-h", "-t", _LIVE_STATES, "-o", "%i"] + ([f"--name={name}"] if name else [])
        return [w for w in self._ok(args).split() if w.isdigit()]

    def _info(self, f: dict[str, str], job_id: str = "") -> JobInfo:
        return JobInfo(f.get("JobId", job_id), f.get("JobName", ""), f.get("JobState", ""),
                       self.expand(f.get("NodeList", "")), self.expand(f.get("ExcNodeList", "")),
                       self.expand(f.get("ReqNodeList", "")), f.get("AdminComment", ""))

    def job(self, job_id: str) -> JobInfo | None:
        r = self._run([self.scontrol, "show", "job", "-o", job_id])
        if r.returncode != 0:
            return None  # finished and forgotten between squeue and here
        return self._info(parse_show_job(r.stdout), job_id)

    def held_moves(self) -> set[str]:
        """Keys of moves in effect: live jobs carrying our token in phase *moved*, on none of the nodes it excluded.

        One `scontrol show job -o` per tick; node lists are expanded only for jobs carrying a token."""
        held: set[str] = set()
        live = set(_LIVE_STATES.split(","))
        for line in self._ok([self.scontrol, "show", "job", "-o"]).splitlines():
            f = parse_show_job(line)
            tok = parse_token(f.get("AdminComment", ""), self.tag)
            if tok is None or tok.phase != "moved" or f.get("JobState") not in live:
                continue
            j = self._info(f)
            if not (j.running and set(j.nodes) & set(tok.excluded)):
                held.add(tok.key)
        return held

    # ---- move_job --------------------------------------------------------------------------
    def move(self, action: Action) -> ActionResult:
        domain_nodes = tuple(n for n in action.param("nodes").split(",") if n)
        if not domain_nodes:
            return ActionResult(False, f"{action.key}: no nodes of domain {action.param('domain')!r} in the action")
        if any(c.isspace() for c in action.key):
            return ActionResult(False, f"{action.key}: a key with whitespace cannot be kept in AdminComment")
        ids = self.job_ids(action.target)
        if not ids:
            return ActionResult(False, f"slurm has no live job named {action.target!r}")
        details = []
        for jid in ids:
            j = self.job(jid)
            if j is not None:
                details.append(f"job {jid}: {self._move_one(j, action.key, domain_nodes)}")
        return ActionResult(True, "; ".join(details) or "jobs finished meanwhile")

    def _move_one(self, j: JobInfo, key: str, domain: tuple[str, ...]) -> str:
        tok = parse_token(j.admin_comment, self.tag)
        tok = tok if tok is not None and tok.key == key else None
        now = self.clock()
        on_domain = j.running and bool(set(j.nodes) & set(domain))
        if not on_domain:
            added = tok.excluded if tok else ()  # a running job's exclusions cannot change: nothing added now
            if j.state == "PENDING" and not set(domain) <= set(j.excluded):
                added = self._added(j, tok, domain)
                self._exclude(j, domain)
            self._mark(j, Token(key, "moved", now, added))
            return f"off the domain ({j.state.lower()}{' on ' + ','.join(j.nodes) if j.nodes else ''})"
        if tok is None or tok.phase != "asked":
            self._mark(j, Token(key, "asked", now, ()))
            asked = self._signal(j)
            if self.grace_s > 0:
                return f"{asked}; requeued off {','.join(domain)} after {self.grace_s:g}s"
            tok = Token(key, "asked", now, ())
        if now - tok.t_s < self.grace_s:
            return f"checkpoint asked {now - tok.t_s:.0f}s ago; requeue in {self.grace_s - (now - tok.t_s):.0f}s"
        added = self._added(j, tok, domain)
        self._ok([self.scontrol, "requeuehold", j.job_id])
        self._exclude(j, domain)
        self._mark(j, Token(key, "moved", now, added))
        self._ok([self.scontrol, "release", j.job_id])
        return f"requeued from {','.join(j.nodes)}, excluding {','.join(sorted(set(j.excluded) | set(domain)))}"

    @staticmethod
    def _added(j: JobInfo, tok: Token | None, domain: tuple[str, ...]) -> tuple[str, ...]:
        """The domain nodes seamguard adds to the job's exclusions (those already there are not ours)."""
        before = set(j.excluded) - set(tok.excluded if tok else ())
        return tuple(n for n in domain if n not in before)

    def _signal(self, j: JobInfo) -> str:
        if not self.signal:
            return "no checkpoint signal configured"
        self._ok([self.scancel, f"--signal={self.signal}", "--full", j.job_id])
        return f"checkpoint asked (SIG{self.signal})"

    def _exclude(self, j: JobInfo, domain: tuple[str, ...]) -> None:
        exc = sorted(set(j.excluded) | set(domain))
        args = [self.scontrol, "update", f"JobId={j.job_id}", f"ExcNodeList={','.join(exc)}"]
        if set(j.required) & set(domain):  # a job pinned to the domain could never start elsewhere
            args.append(f"ReqNodeList={','.join(n for n in j.required if n not in domain)}")
        self._ok(args)

    def _mark(self, j: JobInfo, tok: Token | None) -> None:
        """Put our token first in AdminComment (None removes it), keeping whatever else is there."""
        r = self._run([self.scontrol, "show", "job", "-o", j.job_id])
        line = r.stdout if r.returncode == 0 else ""
        m = re.search(r"(?:^|\s)AdminComment=(.*?)(?=\s[A-Za-z]+=|$)", line)
        words = (m.group(1).split(" ") if m else [])
        rest = " ".join(words[1:] if words and parse_token(words[0], self.tag) else words)
        rest = "" if rest == "(null)" else rest
        text = " ".join(w for w in ((tok.render(self.tag) if tok else ""), rest) if w)
        self._ok([self.scontrol, "update", f"JobId={j.job_id}", f"AdminComment={text}"])

    def unmove(self, key: str) -> ActionResult:
        """Lift a move: our token off every job carrying it, and only the exclusions we added."""
        done = []
        for jid in self.job_ids(ActionKey.parse(key).entity):
            j = self.job(jid)
            tok = parse_token(j.admin_comment, self.tag) if j else None
            if j is None or tok is None or tok.key != key:
                continue
            if tok.excluded and j.state == "PENDING":
                keep = [n for n in j.excluded if n not in tok.excluded]
                self._ok([self.scontrol, "update", f"JobId={jid}", f"ExcNodeList={','.join(keep)}"])
            # a running job's ExcNodeList cannot change; it matters only if the job is requeued
            self._mark(j, None)
            done.append(jid)
        return ActionResult(True, f"move lifted on job(s) {','.join(done)}" if done else "no job carries the move")

    # ---- reservations: no new work on a node -------------------------------------------------
    def reservation_name(self, node: str) -> str:
        return f"{self.prefix}nonew_{node}"

    def reservations(self) -> dict[str, str]:
        """seamguard's no-new-work reservations: name -> node."""
        out: dict[str, str] = {}
        for line in self._ok([self.scontrol, "show", "reservation", "-o"]).splitlines():
            f = parse_show_job(line)
            name = f.get("ReservationName", "")
            if name.startswith(self.prefix + "nonew_"):
                out[name] = name[len(self.prefix + "nonew_"):]
        return out

    def reserve(self, node: str, on: bool) -> str:
        name = self.reservation_name(node)
        have = name in self.reservations()
        if on and not have:
            self._ok([self.scontrol, "create", "reservation", f"ReservationName={name}", f"Nodes={node}",
                      "StartTime=now", "Duration=infinite", "Users=root", "Flags=MAINT,IGNORE_JOBS"])
            return f"reservation {name} created"
        if not on and have:
            self._ok([self.scontrol, "delete", f"ReservationName={name}"])
            return f"reservation {name} deleted"
        return f"reservation {name} {'kept' if on else 'absent'}"
