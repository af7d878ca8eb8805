"""The rails job (`seamguard/testbed/rails_job.py`) under cProfile, for `rail_steady_ab.py --profile`.

Why this exists: where a flap-free step of the rails goes (the chunks' wait, the issue,
the vote, the copies, the model) is read from a profile of the real job on the testbed,
not from a model. Started by the testbed in place of the job, with the job's arguments;
at exit it writes ``prof.<rank>`` (pstats of the training thread) and ``cpu.<rank>.json``
(CPU seconds of the process and of each live thread by name, from /proc) into ``--out``.
The job leaves through ``os._exit``, so both are written from there.
"""

from __future__ import annotations

import cProfile
import json
import os
import sys

from seamguard.testbed import rails_job


def cpu_by_thread() -> dict[str, float]:
    """CPU seconds of this process ("TOTAL", exited threads included) and of its live
    threads, summed by thread name."""
    tck = os.sysconf("SC_CLK_TCK")

    def seconds(stat: str) -> tuple[str, float]:
        fields = stat[stat.rindex(")") + 2:].split()
        return stat[stat.index("(") + 1:stat.rindex(")")], (int(fields[11]) + int(fields[12])) / tck

    rows: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                name, s = seconds(f.read())
        except OSError:  # the thread ended meanwhile
            continue
        rows[name] = rows.get(name, 0.0) + s
    with open("/proc/self/stat") as f:
        rows["TOTAL"] = seconds(f.read())[1]
    return rows


def main(argv: list[str]) -> None:
    out, rank = argv[argv.index("--out") + 1], argv[argv.index("--rank") + 1]
    prof = cProfile.Profile()
    leave = os._exit

    def exit_with_profile(code: int) -> None:
        prof.disable()
        prof.dump_stats(os.path.join(out, f"prof.{rank}"))
        with open(os.path.join(out, f"cpu.{rank}.json"), "w") as f:
            json.dump(cpu_by_thread(), f)
        leave(code)

    os._exit = exit_with_profile
    prof.enable()
    rails_job.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
