"""Hint files -> signed store keys: the launcher's side of the controller's hints.

Node 0's launcher (runtime/launcher.py) takes the hint files a controller writes into
``--hint-dir`` (the protocol: seamguard/hintfiles.py), admits only those signed with the
job's key (seamguard/hintauth.py) and publishes each as a signed store key the
coordinator reads (runtime/coordinator_controls.py, HINT_KEYS). The other way, it writes
which node each rank runs on into the same directory (`publish_placement`), so a
controller draining a node knows which ranks to evacuate first.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from seamguard import hintauth, hintfiles
from seamguard.runtime import keys

# hint files with a value (hintfiles.VALUE_ERRORS checks the text): file name -> (value key,
# counter key); the value is published as written (stripped unless it is a multi-line avoid_rails list)
_VALUED_HINTS = {
    hintfiles.CHECKPOINT_INTERVAL: (keys.HINT_INTERVAL_S, keys.HINT_INTERVAL_N),
    hintfiles.CHECKPOINT_DIR: (keys.HINT_TARGET, keys.HINT_TARGET_N),
    hintfiles.AVOID_RAILS: (keys.HINT_AVOID_RAILS, keys.HINT_AVOID_RAILS_N),
    hintfiles.DEGRADED: (keys.HINT_DEGRADED, keys.HINT_DEGRADED_N),
}


def hint_files(store, hint_dir: Path | None, gate: hintauth.HintGate, log=None) -> None:
    """checkpoint_now -> bump the checkpoint hint; evacuate_rank_<r> -> evacuate hint;
    checkpoint_interval_s (seconds, or "default") -> persist at that interval;
    checkpoint_dir (a directory, or "default") -> persist there;
    avoid_rails (rails to stay off, one "<rail> [severity]" a line, or "default") and
    degraded ("on" or "off") -> step modes (runtime/stepmodes.py);
    rollback -> back to the newest persisted step; rollback_to_step_<s> -> back to s.
    Every file must be signed with the job's key (runtime/hintauth.py): one that is not, is
    forged, replayed or stale is refused (logged as ``hint_refused``) and removed. What is
    taken goes on to the store signed again, where the coordinator verifies it."""
    if hint_dir is None:
        return
    evacuate: list[str] = []
    for name, text in hintfiles.take_files(hint_dir, gate.admit, lambda n, exc: _refused(log, "file", n, exc)):
        p = hint_dir / name
        if p.name == hintfiles.CHECKPOINT_NOW:
            hintauth.send(store, keys.HINT_CHECKPOINT_REQ, "now", gate.key, keys.HINT_CHECKPOINT)
        elif p.name.startswith(hintfiles.EVACUATE_PREFIX):
            evacuate.append(p.name.rsplit("_", 1)[1])
        elif p.name in _VALUED_HINTS:
            value_key, counter_key = _VALUED_HINTS[p.name]
            why = hintfiles.VALUE_ERRORS[p.name](text)
            if why is not None:
                print(f"seamguard launcher: ignoring hint file {p}: {why}", file=sys.stderr)
            else:
                hintauth.send(store, value_key, text if p.name == hintfiles.AVOID_RAILS else text.strip(), gate.key,
                              counter_key)
        else:
            to = p.name.rsplit("_", 1)[1] if p.name != hintfiles.ROLLBACK else "-1"
            if not to.lstrip("-").isdigit():
                print(f"seamguard launcher: ignoring hint file {p}: bad step {to!r}", file=sys.stderr)
            else:
                hintauth.send(store, keys.HINT_ROLLBACK_TO, to, gate.key, keys.HINT_ROLLBACK_N)
    if evacuate:
        _send_evacuations(store, gate.key, evacuate)


def _send_evacuations(store, key: bytes, ranks: list[str]) -> None:
    """Add ranks to the evacuate hint, keeping those of a genuine one not read yet."""
    cur = keys.peek(store, keys.HINT_EVACUATE) or b""
    try:
        pending = hintauth.unseal(key, keys.HINT_EVACUATE, cur.decode())[1] if cur else ""
    except (hintauth.HintRefused, UnicodeDecodeError):
        pending = ""   # not the job's: the coordinator refuses and logs it if it is still there
    hintauth.send(store, keys.HINT_EVACUATE, ",".join(filter(None, [pending, *ranks])), key)


def _refused(log, channel: str, name: str, exc: Exception) -> None:
    """One line (an event) per refused hint."""
    event = {"event": "hint_refused", "channel": channel, "hint": name,
             "reason": getattr(exc, "reason", "unsigned"), "detail": str(exc)[:200]}
    if log is not None:
        log(event)
    else:
        print(f"seamguard launcher: refused hint {name}: {event['detail']}", file=sys.stderr)


PLACEMENT_FILE = hintfiles.PLACEMENT_FILE


def publish_placement(hint_dir: Path | None, view, last: str) -> str:
    """Write which node each rank runs on (by the name the topology uses) into the hint
    directory when it changes, so a controller draining a node knows which ranks to
    evacuate first. Returns what is written now."""
    if hint_dir is None or not view.ranks:
        return last
    text = hintfiles.placement_text(view.job, view.generation, {r.rank: r.host for r in view.ranks})
    if text != last and hint_dir.is_dir():
        tmp = hint_dir / f"{PLACEMENT_FILE}.tmp"
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, hint_dir / PLACEMENT_FILE)
        except OSError as exc:
            print(f"seamguard launcher: cannot write {hint_dir / PLACEMENT_FILE}: {exc.strerror}", file=sys.stderr)
            return last
        return text
    return last
