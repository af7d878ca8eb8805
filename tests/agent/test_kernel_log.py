"""The kernel-log parser as a decision table over real-looking driver lines, and the tails.

Lines follow the formats the NVIDIA driver writes (NVIDIA "XID Errors" catalogue; NVSwitch
SXID lines; the multi-line fallen-off-the-bus message) as they appear in /dev/kmsg,
`journalctl -k -o short-monotonic` and dmesg.
"""

from __future__ import annotations

import os

import pytest

from seamguard.agent.kernel_log import (
    FALLEN,
    SXID,
    UNKNOWN_BUS,
    XID,
    KernelEvent,
    KmsgTail,
    Pending,
    normalize_bdf,
    parse_kernel_lines,
    record_text,
)

J = "[ 1843.308145] gpu-node-07 kernel: "  # journalctl -k -o short-monotonic prefix

TABLE = [
    # (case, lines, expected events)
    ("xid 79 in dmesg form",
     ["[ 5012.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, name=python, GPU has fallen off the bus."],
     [KernelEvent(XID, "0000:3b:00.0", 79)]),
    ("xid 13 with function and upper-case hex",
     [J + "NVRM: Xid (PCI:0000:CB:00.0): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception"],
     [KernelEvent(XID, "0000:cb:00.0", 13)]),
    ("xid 48 with an 8-digit domain",
     ["NVRM: Xid (PCI:00000000:1a:00): 48, pid=1, DBE (double bit error) ECC error"],
     [KernelEvent(XID, "0000:1a:00.0", 48)]),
    ("xid without the PCI: prefix",
     ["NVRM: Xid (0000:41:00): 94, pid=77, Contained ECC error"],
     [KernelEvent(XID, "0000:41:00.0", 94)]),
    ("xid naming no device (very old driver)",
     ["NVRM: Xid 79, GPU has fallen off the bus."],
     [KernelEvent(XID, UNKNOWN_BUS, 79)]),
    ("sxid non-fatal",
     ["[123] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO (First)"],
     [KernelEvent(SXID, "0000:c1:00.0", 28006, "non-fatal")]),
    ("sxid fatal",
     [J + "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)"],
     [KernelEvent(SXID, "0000:c3:00.0", 24007, "fatal")]),
    ("sxid with no severity stated",
     ["nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED"],
     [KernelEvent(SXID, "0004:00:00.0", 26006, "")]),
    ("fallen off the bus over three lines",
     ["[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
      "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
      "               NVRM: fallen off the bus and is not responding to commands."],
     [KernelEvent(FALLEN, "0000:b3:00.0", 79)]),
    ("fallen off the bus with an XID line in between: reported once, as the XID",
     ["NVRM: The NVIDIA GPU 0000:b3:00.0",
      "NVRM: Xid (PCI:0000:b3:00.0): 79, pid=12345, GPU has fallen off the bus.",
      "NVRM: fallen off the bus and is not responding to commands."],
     [KernelEvent(XID, "0000:b3:00.0", 79)]),
    ("an intro never completed is forgotten after a few lines",
     ["NVRM: The NVIDIA GPU 0000:b3:00.0", "a", "b", "c", "d", "e",
      "NVRM: fallen off the bus and is not responding to commands."],
     []),
    ("unrelated NVRM and kernel lines",
     ["NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
      "mlx5_core 0000:3b:00.0: Port module event: module 0, Cable plugged",
      "Some other log message", ""],
     []),
    ("several events in order",
     ["NVRM: Xid (PCI:0000:3b:00): 63, pid=1, Row Remapper", "NVRM: Xid (PCI:0000:3b:00): 64, pid=1, failed",
      "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate"],
     [KernelEvent(XID, "0000:3b:00.0", 63), KernelEvent(XID, "0000:3b:00.0", 64),
      KernelEvent(SXID, "0000:06:00.0", 20009, "non-fatal")]),
]


@pytest.mark.parametrize("case,lines,expected", TABLE, ids=[t[0] for t in TABLE])
def test_parse_kernel_lines(case, lines, expected):
    events, _ = parse_kernel_lines(lines)
    assert events == expected


def test_fallen_off_the_bus_split_across_reads():
    """The intro arrives in one read, the rest in the next: the carried Pending joins them."""
    ev1, pending = parse_kernel_lines(["NVRM: The NVIDIA GPU 0000:b3:00.0"])
    assert ev1 == [] and pending == Pending("0000:b3:00.0", 4)
    ev2, pending = parse_kernel_lines(["NVRM: fallen off the bus and is not responding to commands."], pending)
    assert ev2 == [KernelEvent(FALLEN, "0000:b3:00.0", 79)] and pending is None


@pytest.mark.parametrize("raw,lines", [
    ("3,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
     ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."]),
    ("4,99,1,c;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: fallen off the bus.",
     ["NVRM: The NVIDIA GPU 0000:b3:00.0", "NVRM: fallen off the bus."]),
    (" SUBSYSTEM=pci", []),
    (" DEVICE=+pci:0000:3b:00.0", []),
    ("[ 12.5] host kernel: plain line", ["[ 12.5] host kernel: plain line"]),
])
def test_record_text(raw, lines):
    assert record_text(raw) == lines


def test_kmsg_record_with_escaped_newlines_is_one_event():
    lines = record_text("4,99,1,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in "
                        "this system has\\x0aNVRM: fallen off the bus and is not responding to commands.")
    assert parse_kernel_lines(lines)[0] == [KernelEvent(FALLEN, "0000:b3:00.0", 79)]


@pytest.mark.parametrize("raw,bdf", [("0000:3b:00", "0000:3b:00.0"), ("00000000:3B:00.0", "0000:3b:00.0"),
                                     ("0004:00:00.1", "0004:00:00.1")])
def test_normalize_bdf(raw, bdf):
    assert normalize_bdf(raw) == bdf


def test_tail_starts_at_the_end_and_reads_bounded(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:3b:00): 79, old line from before the agent\n")
    tail = KmsgTail(log, max_lines=3)
    try:
        assert tail.read() == []  # what was there before is skipped
        with log.open("a") as f:
            f.write("".join(f"line {i}\n" for i in range(5)) + "partial")
        assert tail.read() == ["line 0", "line 1", "line 2"]  # bounded per read (8 KiB chunks)
        assert tail.read() == ["line 3", "line 4"]
        with log.open("a") as f:
            f.write(" end\n")
        assert tail.read() == ["partial end"]
    finally:
        tail.close()


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK | os.W_OK), reason="needs root for /dev/kmsg")
def test_real_kmsg_seek_to_end_and_nonblocking():
    """On the real device: the backlog is skipped, a read with nothing new returns at once, a
    line written now is read back — as userspace's (the kernel files a /dev/kmsg write under
    LOG_USER whatever prefix it carries), so it is not counted as the driver's. The test line
    names a PCI address no GPU here has."""
    import time

    tail = KmsgTail("/dev/kmsg", max_lines=10_000)
    try:
        t0 = time.monotonic()
        tail.read()  # may hold lines logged since the open; must not block
        assert time.monotonic() - t0 < 1.0
        with open("/dev/kmsg", "w") as k:
            k.write("<4>NVRM: Xid (PCI:0000:fe:1f): 31, pid=0, seamguard agent test line (not a real GPU)\n")
        raws = [raw for raw in tail.read() if "seamguard agent test line" in raw]
        assert len(raws) == 1 and int(raws[0].split(",", 1)[0]) >> 3 == 1  # facility: user
        assert record_text(raws[0]) == [] and parse_kernel_lines(record_text(raws[0]))[0] == []
    finally:
        tail.close()


def test_journal_tail_reads_a_following_journalctl_without_blocking(tmp_path):
    """source: journal runs `journalctl -k -f ...`; a stand-in script prints two kernel lines and
    stays up; the tail returns what is there without waiting for more, and says so when it exits."""
    import time

    from seamguard.agent.kernel_log import JournalTail

    fake = tmp_path / "journalctl"
    fake.write_text("#!/bin/sh\n"
                    "echo \"[ 1843.308145] node-7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\"\n"
                    "echo \"[ 1843.400000] node-7 kernel: nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28\"\n"
                    "exec sleep 30\n")
    fake.chmod(0o755)
    tail = JournalTail(str(fake), max_lines=100)
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 10
        while len(lines) < 2 and time.monotonic() < deadline:
            t0 = time.monotonic()
            lines += tail.read()
            assert time.monotonic() - t0 < 0.5  # never waits for the next line
            time.sleep(0.05)
        events, _ = parse_kernel_lines(lines)
        assert events == [KernelEvent(XID, "0000:3b:00.0", 79), KernelEvent(SXID, "0000:c3:00.0", 24007, "fatal")]
        assert tail.up
        tail.proc.kill()
        tail.proc.wait(timeout=5)
        tail.read()
        assert not tail.up  # exited: reported, restarted no sooner than RESTART_S
    finally:
        tail.close()
