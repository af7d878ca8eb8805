"""Signed control-plane hints: only a holder of the job's key may steer a running job.

A hint moves a job's checkpoints, evacuates its ranks or rolls it back, so whoever can
write one controls the job. Every hint, whether a file in ``--hint-dir`` or a store key,
is therefore an envelope ``sg-hint-v1 <nonce> <hmac>`` on its first line and the value
after it; the HMAC-SHA256 (key: the job's hint key) covers the hint's name (the file's
name, or the store key's), the nonce and the value. The nonce is the signer's wall clock
in nanoseconds: the verifier (:class:`HintGate`) takes a hint only if its nonce is newer
than the last one it took under that name (an old rollback written back is a replay) and
within ``MAX_AGE_S`` of its own clock (a hint captured before a restart is stale).

Who calls it: the launcher creates the key (``create_key``) and verifies hint files, the
coordinator verifies store hints, the control plane's actuator (act/runtime.py) and
tests sign with ``write_hint_file`` / ``send``. The core (``sign``, ``unseal``,
``HintGate.admit``) is pure; file and store I/O sit in the functions at the bottom.
It sits beside ports.py, below every layer, because both the runtime and the control
plane's actuator use it (the core never imports the runtime); no torch here.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import secrets
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

TAG = "sg-hint-v1"
KEY_FILE_NAME = ".hint-key"
"""Where the launcher writes the job's key (mode 0600) in its ``--hint-dir`` unless
``--hint-key-file`` names another file."""
KEY_FILE_ENV = "SEAMGUARD_HINT_KEY_FILE"
MAX_AGE_S = 600.0
"""A hint signed longer ago than this (or this far in the verifier's future: clock skew)
is refused as stale."""
KEY_BYTES = 32

REASONS = ("unsigned", "forged", "replayed", "stale")


class HintRefused(ValueError):
    """A hint the job does not take; ``reason`` is one of REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


# ---------------------------------------------------------------- pure core
def _mac(key: bytes, name: str, nonce_ns: int, value: str) -> str:
    return hmac.new(key, f"{name}\n{nonce_ns}\n{value}".encode(), hashlib.sha256).hexdigest()


def sign(key: bytes, name: str, value: str, nonce_ns: int) -> str:
    """The envelope of ``value`` for the hint ``name`` (a file name or a store key)."""
    return f"{TAG} {nonce_ns} {_mac(key, name, nonce_ns, value)}\n{value}"


def unseal(key: bytes, name: str, text: str) -> tuple[int, str]:
    """(nonce, value) of a genuine envelope; HintRefused("unsigned" | "forged") otherwise."""
    head, _, value = text.partition("\n")
    parts = head.split(" ")
    if len(parts) != 3 or parts[0] != TAG or not parts[1].isdigit():
        raise HintRefused("unsigned", f"{name}: no {TAG} signature line")
    nonce = int(parts[1])
    if not hmac.compare_digest(parts[2], _mac(key, name, nonce, value)):
        raise HintRefused("forged", f"{name}: signature does not match the job's key")
    return nonce, value


@dataclass
class HintGate:
    """Verifies hints for one job and remembers what it took (one per launcher of node 0).

    ``admit`` returns the value of a genuine, fresh hint and raises HintRefused for any
    other; ``refused`` counts the refusals by reason (the job's metrics show them)."""

    key: bytes
    wall_s: Callable[[], float] = time.time
    max_age_s: float = MAX_AGE_S
    refused: collections.Counter = field(default_factory=collections.Counter)
    _last: dict = field(default_factory=dict)   # name -> newest nonce taken
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, name: str, text: str) -> str:
        try:
            nonce, value = unseal(self.key, name, text)
            with self._lock:
                if nonce <= self._last.get(name, -1):
                    raise HintRefused("replayed", f"{name}: nonce {nonce} is not newer than the last taken")
                age_s = self.wall_s() - nonce / 1e9
                if abs(age_s) > self.max_age_s:
                    raise HintRefused("stale", f"{name}: signed {age_s:.0f}s ago (limit {self.max_age_s:.0f}s)")
                self._last[name] = nonce
            return value
        except HintRefused as exc:
            with self._lock:
                self.refused[exc.reason] += 1
            raise

    def seal(self, name: str, value: str) -> str:
        """Sign with this job's key (the launcher forwarding a file hint into the store)."""
        return sign(self.key, name, value, next_nonce())

    def refusals(self) -> dict[str, int]:
        with self._lock:
            return {**{r: 0 for r in REASONS}, **self.refused}


_nonce_lock = threading.Lock()
_nonce_last = [0]


def next_nonce() -> int:
    """The wall clock in ns, strictly increasing within this process."""
    with _nonce_lock:
        _nonce_last[0] = max(time.time_ns(), _nonce_last[0] + 1)
        return _nonce_last[0]


# ---------------------------------------------------------------- key files (the edge)
def create_key(path: Path) -> bytes:
    """A fresh random key, written to ``path`` with mode 0600 (replacing what was there,
    atomically); never printed."""
    key = secrets.token_bytes(KEY_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, key.hex().encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return key


def read_key(path: Path, private: bool = False) -> bytes:
    """The key in ``path`` (hex). ``private``: refuse a file others may read (the launcher
    taking an operator's key file). ValueError names the file and what is wrong."""
    try:
        st = os.stat(path)
        text = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"hint key file {path}: cannot read it ({getattr(exc, 'strerror', exc)})") from None
    if private and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"hint key file {path}: mode {stat.S_IMODE(st.st_mode):o} lets others read it "
                         "(chmod 600 it)")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ValueError(f"hint key file {path}: expected at least 32 hex digits")
    return key


def job_key(hint_dir: Path | None, key_file: Path | None = None) -> bytes:
    """A job's hint key as the process that verifies its hints takes it: an operator's
    existing ``key_file`` (refused if others may read it), else a fresh random key written
    0600 to ``key_file`` or ``<hint_dir>/.hint-key`` (else held in memory only). Used by
    `seamguard launch` and by the job hook of a job started without it; ValueError names
    the file and what is wrong."""
    if key_file is not None and Path(key_file).exists():
        return read_key(Path(key_file), private=True)
    if hint_dir is not None:
        Path(hint_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    path = Path(key_file) if key_file is not None else (Path(hint_dir) / KEY_FILE_NAME if hint_dir is not None
                                                        else None)
    try:
        return create_key(path) if path is not None else os.urandom(KEY_BYTES)
    except OSError as exc:
        raise ValueError(f"hint key file {path}: cannot write it ({exc.strerror or exc})") from None


def key_file_for(hint_dir: Path, key_file: Path | None = None) -> Path:
    """Where a signer finds a job's key: the file named, else the one in its hint directory."""
    return Path(key_file) if key_file is not None else Path(hint_dir) / KEY_FILE_NAME


def write_hint_file(hint_dir: Path, name: str, value: str, key: bytes) -> Path:
    """Drop a signed hint file (atomically: a temp file renamed into place)."""
    path = Path(hint_dir) / name
    tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(sign(key, name, value, next_nonce()))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def hint_file_value(path: Path) -> str:
    """The value a hint file carries, signature line aside (what a reader of it wants)."""
    text = Path(path).read_text(encoding="utf-8")
    return text.partition("\n")[2] if text.startswith(TAG + " ") else text


def send(store, value_key: str, value: str, key: bytes, counter_key: str | None = None) -> None:
    """Write a signed store hint: the envelope under ``value_key``, then ring its counter."""
    store.set(value_key, sign(key, value_key, value, next_nonce()))
    if counter_key is not None:
        store.add(counter_key, 1)
