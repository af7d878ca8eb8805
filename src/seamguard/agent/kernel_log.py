"""GPU errors in the kernel log: XID, SXID (NVSwitch) and "fallen off the bus" lines.

The NVIDIA driver writes these to the kernel ring buffer; NVSentinel's syslog health
monitor reads the same three kinds from the journal (docs/sources.md, "Kernel log"). The
parser is a pure function over lines — a fold that carries one pending PCI address across
lines, because "The NVIDIA GPU <bdf> ... has fallen off the bus" spans several — so it is
tested with a decision table. The tails below it (``KmsgTail``, ``JournalTail``) do the
I/O: they start at the end of the log, never block and read a bounded number of lines.

Patterns match only where the kernel's message starts, never inside it: kernel lines
quote text that unprivileged users choose (a file name in "process '...' started with
executable stack", a task name leading a segfault line), so a pattern found anywhere in
a line would let anyone on the node report a GPU fault. What precedes the message is the
prefix of the form the agent reads (``record_text`` takes off a /dev/kmsg header;
``message_start`` a journalctl or dmesg prefix); a /dev/kmsg record that userspace wrote
(facility other than kernel) is dropped, and the continuation lines of a multi-line
record count only when its first line is the driver's own.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("seamguard.agent.kernel_log")

XID, SXID, FALLEN = "xid", "sxid", "fallen_off_bus"
UNKNOWN_BUS = "unknown"

_BDF = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus." (also without "PCI:")
_XID = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<bdf>{_BDF})\): (?P<code>\d+)")
# very old drivers name no device: "NVRM: Xid 79, GPU has fallen off the bus."
_XID_BARE = re.compile(r"NVRM: Xid (?P<code>\d+)[,:]")
# "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 ..."
_SXID = re.compile(rf"nvidia-nvswitch\d+: SXid \(PCI:(?P<bdf>{_BDF})\): (?P<code>\d+)(?:, (?P<sev>Fatal|Non-fatal))?")
# "NVRM: The NVIDIA GPU 0000:b3:00.0" ... "NVRM: fallen off the bus and is not responding to commands."
_GPU_INTRO = re.compile(rf"NVRM: The NVIDIA GPU (?P<bdf>{_BDF})")
_FALLEN = re.compile(r"NVRM: .*fallen off the bus")
_DRIVER = ("NVRM: ", "nvidia-nvswitch")  # how the driver's own messages begin
# What precedes the kernel's message in the forms read here: dmesg "[ 5012.1] " (and its
# continuation lines, indented to the message column); `journalctl -k -o short-monotonic`
# "[ 1843.308145] host kernel: "; `journalctl -k` "Dec 07 01:58:16 host kernel: ".
_PREFIX = re.compile(r"\[\s*\d+(?:\.\d+)?\] (?:\S+ kernel: )?"
                     r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: "
                     r"|\s+")
# The kernel starts some messages with a task's name (comm: at most 15 bytes, then
# "[pid]"), e.g. "python3[812]: segfault at 0": the task chose those bytes.
_COMM_LED = re.compile(r".{1,15}\[\d+\]")
_PENDING_LINES = 4  # an intro line not completed within this many lines is dropped
_KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


@dataclass(frozen=True)
class KernelEvent:
    """One GPU/NVSwitch error line: what, on which PCI device, which code."""

    kind: str  # XID | SXID | FALLEN
    pci_bus_id: str  # '0000:3b:00.0', or UNKNOWN_BUS
    code: int  # the XID/SXID number; 79 for a fallen-off-the-bus message (what XID 79 means)
    severity: str = ""  # SXID: 'fatal' | 'non-fatal' | '' (not stated)


@dataclass(frozen=True)
class Pending:
    """A "The NVIDIA GPU <bdf>" line waiting for its "fallen off the bus" line."""

    bdf: str
    lines_left: int


def normalize_bdf(raw: str) -> str:
    """'00000000:3B:00' -> '0000:3b:00.0': 4-digit domain, lower case, function 0 when absent."""
    dom, bus, rest = raw.lower().split(":", 2)
    if "." not in rest:
        rest += ".0"
    return f"{dom[-4:].rjust(4, '0')}:{bus}:{rest}"


def parse_kernel_lines(lines: Iterable[str], pending: Pending | None = None
                       ) -> tuple[list[KernelEvent], Pending | None]:
    """Events in ``lines`` and the fallen-off-the-bus intro still waiting for its last line.

    Pure. An XID line between the intro and "fallen off the bus" cancels the intro: that
    message is then reported as the XID (79) it is, not twice.
    """
    out: list[KernelEvent] = []
    for raw in lines:
        line = message_start(raw)
        m = _XID.match(line)
        if m:
            out.append(KernelEvent(XID, normalize_bdf(m["bdf"]), int(m["code"])))
            pending = None
            continue
        m = _XID_BARE.match(line)
        if m:
            out.append(KernelEvent(XID, UNKNOWN_BUS, int(m["code"])))
            pending = None
            continue
        m = _SXID.match(line)
        if m:
            out.append(KernelEvent(SXID, normalize_bdf(m["bdf"]), int(m["code"]), (m["sev"] or "").lower()))
            continue
        m = _GPU_INTRO.match(line)
        if m:
            pending = Pending(normalize_bdf(m["bdf"]), _PENDING_LINES)
            if not _FALLEN.match(line):
                continue
        if pending is not None and _FALLEN.match(line):
            out.append(KernelEvent(FALLEN, pending.bdf, 79))
            pending = None
        elif pending is not None:
            pending = Pending(pending.bdf, pending.lines_left - 1) if pending.lines_left > 1 else None
    return out, pending


def message_start(line: str) -> str:
    """The kernel's message in one line: a dmesg or journalctl prefix taken off; a line the
    kernel began with a task's chosen name becomes empty (nothing in it is the driver's)."""
    m = _PREFIX.match(line)
    msg = line[m.end():] if m else line
    return "" if _COMM_LED.match(msg) else msg


def record_text(raw: str) -> list[str]:
    """The message lines of one log line: a /dev/kmsg record loses its ``prio,seq,usec,flags;``
    header and its escaped newlines (``\\x0a``) become line breaks; its dictionary lines
    (`` SUBSYSTEM=...``) are dropped. Other lines pass through.

    A kmsg record whose facility is not the kernel's (userspace wrote it to /dev/kmsg) gives
    no lines; of a multi-line record only the driver's own keeps its continuation lines, so a
    newline inside a quoted file name does not start a line of its own.
    """
    if raw.startswith(" "):
        return []  # kmsg continuation: key=value dictionary
    head, sep, body = raw.partition(";")
    if sep and head.count(",") >= 3 and head.split(",", 1)[0].isdigit():
        if int(head.split(",", 1)[0]) >> 3 != 0:  # syslog facility: 0 is the kernel
            return []
        raw = body
    if "\\x" in raw:
        raw = _KMSG_ESCAPE.sub(lambda m: chr(int(m[1], 16)), raw)
    first, *rest = raw.split("\n")
    return [first, *rest] if message_start(first).startswith(_DRIVER) else [first]


class _Lines:
    """Whole lines from a non-blocking fd, at most ``max_lines`` per call; a partial line waits."""

    def __init__(self, fd: int, max_lines: int) -> None:
        self.fd, self.max_lines = fd, max_lines
        self.partial = b""
        self.ready: list[str] = []
        self.overrun = 0  # kmsg records overwritten before they were read (EPIPE)

    def read(self) -> list[str]:
        # Lines past the bound wait in ``ready`` (at most one 8 KiB chunk's worth beyond it).
        while len(self.ready) < self.max_lines:
            try:
                chunk = os.read(self.fd, 8192)  # one record per read on /dev/kmsg
            except BlockingIOError:
                break
            except BrokenPipeError:  # kmsg: the ring wrapped past us; reading goes on at the oldest record
                self.overrun += 1
                continue
            if not chunk:
                break  # EOF: a regular file, or a pipe whose writer exited
            *whole, self.partial = (self.partial + chunk).split(b"\n")
            if len(self.partial) > 65536:  # a "line" this long is not a log line
                self.partial = b""
            self.ready.extend(w.decode("utf-8", "replace") for w in whole)
        out, self.ready = self.ready[:self.max_lines], self.ready[self.max_lines:]
        return out


class KmsgTail:
    """New records of /dev/kmsg (or any file) since the agent started; never blocks."""

    def __init__(self, path: Path, max_lines: int) -> None:
        self.path = path
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(fd, 0, os.SEEK_END)  # kmsg: skip the boot backlog; a file: skip what is there
        self.lines = _Lines(fd, max_lines)
        self.up = True

    def read(self) -> list[str]:
        return self.lines.read()

    def close(self) -> None:
        os.close(self.lines.fd)


class JournalTail:
    """`journalctl -k -f` from now on, read without blocking; restarted (at most every 30 s) if it exits."""

    RESTART_S = 30.0

    def __init__(self, journalctl: str, max_lines: int, clock=time.monotonic) -> None:
        self.cmd = [journalctl, "-k", "-f", "-n", "0", "-o", "short-monotonic", "--no-pager"]
        self.max_lines, self.clock = max_lines, clock
        self.proc: subprocess.Popen | None = None
        self.lines: _Lines | None = None
        self.started = -1e18
        self.up = False
        self._start()

    def _start(self) -> None:
        self.started = self.clock()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.lines = _Lines(self.proc.stdout.fileno(), self.max_lines)
        self.up = True

    def read(self) -> list[str]:
        out = self.lines.read() if self.lines else []
        if self.proc is not None and self.proc.poll() is not None:
            if self.up:
                log.warning("journalctl exited with status %s; restarting it within %.0f s",
                            self.proc.returncode, self.RESTART_S)
            self.up = False
            if self.clock() - self.started >= self.RESTART_S:
                self.close()
                self._start()
        return out

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=2.0)
            self.proc.stdout.close()
            self.proc = None
