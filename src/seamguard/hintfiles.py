"""The hint-file protocol: the files a controller writes into a job's ``--hint-dir`` and
the job's launcher reads, defined once for both sides.

The control plane's actuator (act/runtime.py) writes these files and the runtime's
launcher (runtime/launcher.py) validates and forwards them; both take the names, the
value formats and their checks from here, so the two sides cannot drift. Each file is
signed (hintauth.py); this module is about names, values and taking the files out of the
directory (:func:`take_files`, which the launcher and the job hook of a job started
without it, runtime/hintclient.py, both read through). The launcher also
writes ``.placement.json`` (which node each rank runs on) for the actuator to read. It
sits beside hintauth.py, below every layer, and imports no torch: the control plane uses it.

Files (docs/runtime.md, "Control-plane hints"):

- ``checkpoint_now``: persist the next snapshot (one shot; any text);
- ``checkpoint_interval_s``: seconds > 0, or ``default`` (the job's own ``--persist-every``);
- ``checkpoint_dir``: an absolute directory, or ``default`` (the job's own);
- ``avoid_rails``: one ``<rail> [severity]`` a line, or ``default`` (none);
- ``degraded``: ``on`` or ``off``;
- ``evacuate_rank_<r>``: move rank r to a spare; ``rollback`` / ``rollback_to_step_<s>``:
  back to the newest persisted step / to step s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

CHECKPOINT_NOW = "checkpoint_now"
CHECKPOINT_INTERVAL = "checkpoint_interval_s"
CHECKPOINT_DIR = "checkpoint_dir"
AVOID_RAILS = "avoid_rails"
DEGRADED = "degraded"
ROLLBACK = "rollback"
EVACUATE_PREFIX = "evacuate_rank_"
ROLLBACK_TO_PREFIX = "rollback_to_step_"
DEFAULT = "default"
"""The value that takes a held hint back to the job's own setting."""
PLACEMENT_FILE = ".placement.json"
"""Written by the launcher: ``{"job", "gen", "ranks": {rank: node}}``."""
SEVERITY_UNKNOWN = 99
"""A rail asked to be avoided without a state: the worst."""


def evacuate_file(rank: int) -> str:
    return f"{EVACUATE_PREFIX}{rank}"


def rollback_to_file(step: int) -> str:
    return f"{ROLLBACK_TO_PREFIX}{step}"


def is_hint_file(name: str) -> bool:
    """Whether ``name`` is one of the protocol's files (anything else in the directory is not read)."""
    return name in (CHECKPOINT_NOW, ROLLBACK) or name in VALUE_ERRORS or \
        name.startswith((EVACUATE_PREFIX, ROLLBACK_TO_PREFIX))


# ---------------------------------------------------------------- values, written
def interval_text(seconds: float | None) -> str:
    """``checkpoint_interval_s``'s text; None: ``default``."""
    return f"{DEFAULT if seconds is None else seconds}\n"


def avoid_rails_text(rails: dict[str, int]) -> str:
    """``avoid_rails``' text: one ``<rail> <severity>`` a line, sorted; none: ``default``."""
    return "".join(f"{r} {s}\n" for r, s in sorted(rails.items())) or f"{DEFAULT}\n"


def degraded_text(on: bool) -> str:
    return "on\n" if on else "off\n"


def placement_text(job: str, gen: int, ranks: dict[int, str]) -> str:
    """``.placement.json``'s text: which node (by the topology's name) each rank runs on."""
    return json.dumps({"job": job, "gen": gen, "ranks": {str(r): host for r, host in sorted(ranks.items())}})


# ---------------------------------------------------------------- values, read
def _positive_number(text: str) -> bool:
    try:
        return float(text) > 0 and float(text) != float("inf")
    except ValueError:
        return False


def interval_error(text: str) -> str | None:
    want = text.strip()
    return None if want == DEFAULT or _positive_number(want) else \
        f"expected seconds > 0 or '{DEFAULT}', got {want[:40]!r}"


def target_error(text: str) -> str | None:
    want = text.strip()
    return None if want == DEFAULT or Path(want).is_absolute() else \
        f"expected an absolute directory or '{DEFAULT}', got {want[:80]!r}"


def parse_avoid_rails(text: str) -> dict[str, int]:
    """An ``avoid_rails`` file -> {rail: severity}. One rail a line, ``<rail> [severity]``;
    ``default`` (or nothing) avoids none. Raises ValueError naming the bad line."""
    out: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts or parts == [DEFAULT]:
            continue
        if len(parts) > 2 or "," in parts[0] or (len(parts) == 2 and not parts[1].isdigit()):
            raise ValueError(f"line {n}: expected '<rail> [severity]', got {line[:60]!r}")
        out[parts[0]] = int(parts[1]) if len(parts) == 2 else SEVERITY_UNKNOWN
    return out


def avoid_rails_error(text: str) -> str | None:
    try:
        parse_avoid_rails(text)
    except ValueError as exc:
        return str(exc)
    return None


def degraded_error(text: str) -> str | None:
    return None if text.strip() in ("on", "off") else f"expected 'on' or 'off', got {text.strip()[:40]!r}"


VALUE_ERRORS: dict[str, Callable[[str], str | None]] = {
    CHECKPOINT_INTERVAL: interval_error, CHECKPOINT_DIR: target_error,
    AVOID_RAILS: avoid_rails_error, DEGRADED: degraded_error}
"""The files that carry a value -> what is wrong with a text (None: nothing)."""


def take_files(hint_dir: Path, admit: Callable[[str, str], str],
               refused: Callable[[str, ValueError], None]) -> list[tuple[str, str]]:
    """(name, value) of each protocol file in ``hint_dir``, in name order (a directory move
    before a checkpoint asked in the same poll), each removed once read. ``admit(name, text)``
    verifies a file's envelope and returns its value (hintauth.HintGate.admit); a file it
    refuses (a ValueError: unsigned, forged, replayed, stale, not UTF-8) goes to
    ``refused(name, error)`` and is removed too. A file being replaced is read next time."""
    if not Path(hint_dir).is_dir():
        return []
    out = []
    for p in sorted(Path(hint_dir).iterdir()):
        if not is_hint_file(p.name):
            continue
        try:
            value = admit(p.name, p.read_text(encoding="utf-8"))
        except OSError:
            continue  # being replaced: read it next poll
        except ValueError as exc:
            refused(p.name, exc)
            p.unlink(missing_ok=True)
            continue
        p.unlink(missing_ok=True)
        out.append((p.name, value))
    return out


def ranks_on(placement_text_: str, node: str) -> list[int]:
    """The ranks a ``.placement.json`` text places on ``node`` (none if it is unreadable)."""
    try:
        placement = json.loads(placement_text_)
        return sorted(int(r) for r, host in placement["ranks"].items() if host == node)
    except (ValueError, KeyError, TypeError, AttributeError):
        return []
