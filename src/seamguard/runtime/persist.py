"""The persister: a separate process that writes snapshots to storage off the training path.

Each worker starts one (`python -m seamguard.runtime.persist`). The worker sends, one
JSON line per request on stdin, the path of a shared-memory snapshot slot and its
manifest; the persister writes the checkpoint (manifest.write_checkpoint: commit marker
last), prunes old ones and answers one JSON line on stdout. The slot stays pinned (not
reused) until the answer arrives. A persister killed mid-write leaves no commit marker,
so the torn checkpoint is never loaded. No torch is imported here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from seamguard.runtime import chaos
from seamguard.runtime.manifest import CheckpointError, Manifest, prune, write_checkpoint


def serve(stdin=sys.stdin, stdout=sys.stdout) -> None:
    injector = chaos.from_env_without_store()
    for line in stdin:
        req = json.loads(line)
        manifest = Manifest.from_json(req["manifest"])
        reply = {"slot": req["slot"], "step": manifest.step, "ok": True, "error": ""}
        try:
            payload = np.memmap(req["slot_path"], dtype=np.uint8, mode="r")
            write_checkpoint(Path(req["dir"]), manifest, payload,
                             before_commit=lambda: injector.maybe_fire_persist(
                                 manifest.rank, manifest.step))
            prune(Path(req["dir"]), manifest.rank, int(req["keep"]))
            del payload
        except (CheckpointError, OSError, ValueError) as exc:
            reply.update(ok=False, error=str(exc))
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


if __name__ == "__main__":
    serve()
