"""One node's launcher part for tests/runtime/test_membership_links.py, as its own process.

    python tests/runtime/membership_node_proc.py ETCD_HOST:PORT RUN_ID NODE STATUS_FILE KEY_FILE

Runs `NodeMembership` for node NODE with 8 worker ids (NODE*8 ..) and two stand-in rank
processes (``sleep``), and rewrites STATUS_FILE every 0.1 s with what it knows: its hub's
address, whether it coordinates, its reporter's connects, the losses it judged, its rank
pids. KEY_FILE holds the job's hint key (hintauth); its links are signed with
the key derived from it. Killing its process group kills the node: launcher and ranks alike. No torch.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from seamguard import hintauth
from seamguard.runtime import roster
from seamguard.runtime.liveness import link_key
from seamguard.runtime.node_membership import NodeMembership


async def main(endpoint: str, run_id: str, node: int, status: Path, key_file: Path) -> None:
    host, port = endpoint.rsplit(":", 1)
    ranks = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    counter = 0

    def beats() -> dict[int, tuple[int, int]]:
        nonlocal counter
        counter += 1
        return {node * 8 + i: (counter, counter) for i in range(8)}

    nm = NodeMembership(roster.Roster(roster.connect((host, int(port))), run_id), run_id, node, beats,
                        link_key(hintauth.read_key(key_file)))
    stop = asyncio.Event()
    task = asyncio.create_task(nm.run(stop))
    try:
        while not task.done():
            tmp = status.with_suffix(".tmp")
            tmp.write_text(json.dumps({"pid": os.getpid(), "address": nm.address, "coordinates": nm.coordinates,
                                       "connects": nm.reporter.connects, "rank_pids": [r.pid for r in ranks],
                                       "lost": [[x.node, sorted(x.workers), x.why] for x in nm.lost]}))
            tmp.replace(status)
            await asyncio.sleep(0.1)
        await task
    finally:
        for r in ranks:
            r.kill()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5])))
