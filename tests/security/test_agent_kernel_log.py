"""Forged GPU faults: driver text smuggled into kernel lines that quote what a user chose.

Each attack runs the real agent (``Agent`` on a free port, scraped over HTTP) reading the
kernel log in the form it reads on a node — /dev/kmsg records from a file standing in for
the device, or `journalctl -k -o short-monotonic` from a stand-in journalctl — with one real
driver XID after the forged line as the control: the control must be counted (so the lines
were read) and the forged one must not.
"""

from __future__ import annotations

import time
from pathlib import Path

from seamguard.agent.config import parse_agent_config
from seamguard.agent.exporter import Agent
from seamguard.ports import free_port
from tests.agent.conftest import samples, scrape

CONTROL = "NVRM: Xid (PCI:0000:18:00): 48, pid=1, DBE (double bit error) ECC error"
FORGED_BDF = "0000:3b:00.0"
QUOTED = "process '/tmp/NVRM: Xid (PCI:0000:3b:00): 79, x' started with executable stack"


def _gpu_faults(tmp_path: Path, kmsg_records: list[str] | None = None,
                journal_lines: list[str] | None = None) -> dict[str, float]:
    """{pci_bus_id: XIDs + SXIDs + fallen-off-the-bus counted} once the control line has been read."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    source = f"{{path: {kmsg}}}"
    if journal_lines is not None:
        fake = tmp_path / "journalctl"
        body = "".join(f"printf '%s\\n' '{ln.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}'\n"
                       for ln in journal_lines)
        fake.write_text(f"#!/bin/sh\n{body}exec sleep 30\n")
        fake.chmod(0o755)
        source = f"{{source: journal, journalctl: {fake}}}"
    port = free_port()
    cfg = parse_agent_config(f"version: 1\nnode: node-0\nlisten: {{host: 127.0.0.1, port: {port}}}\n"
                             f"kernel_log: {source}\nfabric: {{enabled: false}}\nstorage: {{enabled: false}}\n"
                             f"gpus: {{enabled: false}}\n", "agent.yaml")
    agent = Agent(cfg)
    agent.start()
    try:
        if kmsg_records is not None:
            with kmsg.open("a") as f:
                f.write("".join(r + "\n" for r in kmsg_records))
        counts: dict[str, float] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for (name, labels), v in samples(scrape(port)).items():
                if name in ("seamguard_xid_errors_total", "seamguard_sxid_errors_total",
                            "seamguard_gpu_fallen_off_bus_total"):
                    bdf = dict(labels)["pci_bus_id"]
                    counts[bdf] = counts.get(bdf, 0.0) + v
            if counts.get("0000:18:00.0"):
                return counts
            counts = {}
            time.sleep(0.2)
        raise AssertionError("the control XID line was never counted: the agent did not read the log")
    finally:
        agent.stop()


def _kmsg(seq: int, text: str, prio: int = 6) -> str:
    """A /dev/kmsg record as the device gives it: prio,seq,usec,flags;text (newlines escaped)."""
    return f"{prio},{seq},{seq * 1000},-;" + text.replace("\n", "\\x0a")


def test_agent_xid_quoted_in_a_file_name_via_kmsg(tmp_path, observed):
    """An unprivileged user runs `/tmp/NVRM: Xid (PCI:0000:3b:00): 79, x` so the kernel logs the name (/dev/kmsg).

    Refused: the XID pattern matches only where the kernel's message starts; the quoted name counts as nothing.
    """
    counts = _gpu_faults(tmp_path, kmsg_records=[_kmsg(1, QUOTED), _kmsg(2, CONTROL, prio=4)])
    observed(f"GPU faults counted per bus id: {counts}")
    assert counts.get(FORGED_BDF, 0.0) == 0.0 and counts == {"0000:18:00.0": 1.0}


def test_agent_xid_quoted_in_a_file_name_via_journal(tmp_path, observed):
    """The same file-name XID, read through `journalctl -k -o short-monotonic`.

    Refused: the journal's "[ts] host kernel: " prefix is taken off and the pattern anchored after it.
    """
    counts = _gpu_faults(tmp_path, journal_lines=[f"[ 1843.308145] gpu-node-07 kernel: {QUOTED}",
                                                  f"[ 1843.400000] gpu-node-07 kernel: {CONTROL}"])
    observed(f"GPU faults counted per bus id: {counts}")
    assert counts.get(FORGED_BDF, 0.0) == 0.0 and counts == {"0000:18:00.0": 1.0}


def test_agent_xid_after_a_newline_in_a_file_name(tmp_path, observed):
    """A file name holding a newline puts `NVRM: Xid (PCI:0000:3b:00): 79` at the start of a kmsg continuation line.

    Refused: continuation lines of a record count only when its first line is the driver's own.
    """
    counts = _gpu_faults(tmp_path, kmsg_records=[
        _kmsg(1, "process '/tmp/a\nNVRM: Xid (PCI:0000:3b:00): 79, x' started with executable stack"),
        _kmsg(2, CONTROL, prio=4)])
    observed(f"GPU faults counted per bus id: {counts}")
    assert counts.get(FORGED_BDF, 0.0) == 0.0 and counts == {"0000:18:00.0": 1.0}


def test_agent_xid_written_to_kmsg_by_userspace(tmp_path, observed):
    """A process writes `NVRM: Xid (PCI:0000:3b:00): 79` into /dev/kmsg (the kernel files it under LOG_USER).

    Refused: a kmsg record whose facility is not the kernel's is not read as the driver's.
    """
    counts = _gpu_faults(tmp_path, kmsg_records=[_kmsg(1, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, forged", prio=12),
                                                 _kmsg(2, CONTROL, prio=4)])
    observed(f"GPU faults counted per bus id: {counts}")
    assert counts.get(FORGED_BDF, 0.0) == 0.0 and counts == {"0000:18:00.0": 1.0}


def test_agent_xid_led_by_a_task_name(tmp_path, observed):
    """A task names itself `NVRM: Xid 79, ` and segfaults; the kernel starts the segfault line with that name.

    Refused: a message the kernel begins with a task's name (comm, then [pid]) is not the driver's.
    """
    line = "NVRM: Xid 79, [4242]: segfault at 0 ip 0000000000401000 sp 00007ffd00000000 error 4 in a.out"
    counts = _gpu_faults(tmp_path, kmsg_records=[_kmsg(1, line), _kmsg(2, CONTROL, prio=4)])
    observed(f"GPU faults counted per bus id: {counts}")
    assert sum(v for k, v in counts.items() if k != "0000:18:00.0") == 0.0 and counts == {"0000:18:00.0": 1.0}
