"""Scenario scrapes as OpenMetrics text with timestamps, labelled as the real exporters label them.

The file feeds ``promtool tsdb create-blocks-from openmetrics``. OpenMetrics wants every
family's samples together, so each series name gets its own spool file while the
scenario runs; ``close()`` joins them under their HELP/TYPE lines and ends with ``# EOF``.
Memory stays flat whatever the fleet size.

Labels: dcgm-exporter's (``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``,
``DCGM_FI_DRIVER_VERSION``) plus the scrape's ``instance`` and ``job``; node_exporter's
infiniband collector (``device``, ``port``) with the node only in ``instance``
(``host:9100``), so the label mapping's default has to strip the port; seamguard's own
series with the labels of docs/prometheus-slurm.md; the node agent's with ``node`` and its
own port (docs/agent.md). Several series may share one family (the agent's SXid counter, one
series per code and severity), written together under one HELP/TYPE. A driver update changes
the driver label, so the GPU's series changes identity mid-history, as it does in a real TSDB.
"""

from __future__ import annotations

import shutil
import tempfile
import zlib
from pathlib import Path

import numpy as np

from seamguard.fleet.model import Fleet, Kind
from seamguard.scenarios.metrics import SERIES

MODEL_NAME = "NVIDIA H100 80GB HBM3"


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in d.items()) + "}"


class OpenMetricsWriter:
    """A scenario sink: ``writer(t, values, driver_per_node)``; ``close()`` writes ``path``."""

    def __init__(self, path: Path, fleet: Fleet) -> None:
        self.path = Path(path)
        self.fleet = fleet
        self._dir = Path(tempfile.mkdtemp(prefix="seamguard-om-"))
        self._families = list(dict.fromkeys(s.exported for s in SERIES))
        self._help = {s.exported: s.help for s in reversed(SERIES)}
        self._fh = {fam: open(self._dir / f"{i:03d}", "w", encoding="utf-8") for i, fam in enumerate(self._families)}
        self._static = {k: self._static_labels(k) for k in (Kind.NIC, Kind.LINK, Kind.COOLING_LOOP, Kind.RACK,
                                                            Kind.STORAGE, Kind.JOB, Kind.NODE)}
        self._agent = [{"instance": f"{n}:9475", "job": "seamguard-agent", "node": n} for n in fleet.node_names]
        self._series_labels = {s.name: [_labels({**a, **dict(s.labels)}) for a in self._agent]
                               for s in SERIES if s.exporter == "agent"}
        self._gpu_cache: dict[tuple[str, str], list[str]] = {}
        self.samples = 0

    def _static_labels(self, kind: Kind) -> list[str]:
        f = self.fleet
        if kind == Kind.NIC:
            out = []
            for i, name in enumerate(f.nic_names):
                node = f.node_names[int(f.nic_node[i])]
                dev = name[len(node) + 1:] if name.startswith(node + "/") else f"mlx5_{int(f.nic_rail[i])}"
                out.append(_labels({"device": dev, "instance": f"{node}:9100", "job": "node", "port": "1"}))
            return out
        if kind == Kind.NODE:  # node_exporter's edac collector: one memory controller summed per node here
            return [_labels({"controller": "0", "instance": f"{n}:9100", "job": "node"}) for n in f.node_names]
        if kind == Kind.RACK:
            return [_labels({"cooling_loop": f.loop_names[int(f.rack_loop[i])], "instance": "bms:9200",
                             "job": "facility", "rack": r}) for i, r in enumerate(f.rack_names)]
        key = {Kind.LINK: ("link", "fabric-probe"), Kind.COOLING_LOOP: ("cooling_loop", "facility"),
               Kind.STORAGE: ("storage", "storage-probe"), Kind.JOB: ("job_name", "seamguard-runtime")}[kind]
        return [_labels({"instance": f"{key[1]}:9300", "job": key[1], key[0]: n}) for n in f.names(kind)]

    def _gpu_labels(self, exporter: str, driver: list[str]) -> list[str]:
        f = self.fleet
        out = []
        per_node: dict[int, int] = {}
        for g, n in enumerate(f.gpu_node.tolist()):
            i = per_node.get(n, 0)
            per_node[n] = i + 1
            key = (exporter, f"{g}|{driver[n]}")
            lab = self._gpu_cache.get(key)
            if lab is None:
                node = f.node_names[n]
                if exporter == "runtime":
                    lab = _labels({"Hostname": node, "gpu": str(i), "instance": f"{node}:9500",
                                   "job": "seamguard-runtime"})
                else:
                    lab = _labels({"DCGM_FI_DRIVER_VERSION": driver[n], "Hostname": node, "UUID":
                                   f"GPU-{zlib.crc32(f.gpu_names[g].encode()):08x}", "device": f"nvidia{i}",
                                   "gpu": str(i), "instance": f"{node}:9400", "job": "dcgm-exporter",
                                   "modelName": MODEL_NAME})
                self._gpu_cache[key] = lab
            out.append(lab)
        return out

    def __call__(self, t: float, values: dict[str, np.ndarray], driver: list[str]) -> None:
        ts = f" {t:.3f}\n"
        gpu = {"dcgm": None, "runtime": None}
        for s in SERIES:
            arr = values.get(s.name)
            if arr is None:
                continue
            if s.kind == Kind.GPU:
                ex = "runtime" if s.exporter == "runtime" else "dcgm"
                if gpu[ex] is None:
                    gpu[ex] = self._gpu_labels(ex, driver)
                labs = gpu[ex]
            else:
                labs = self._series_labels.get(s.name) or self._static[s.kind]
            ok = np.flatnonzero(np.isfinite(arr))
            vals = arr[ok]
            strs = [str(v) for v in vals.astype(np.int64).tolist()] if s.integer else [repr(v) for v in vals.tolist()]
            name = s.exported
            self._fh[name].write("".join([f"{name}{labs[i]} {v}{ts}" for i, v in zip(ok.tolist(), strs)]))
            self.samples += len(ok)

    def close(self) -> Path:
        for fh in self._fh.values():
            fh.close()
        try:
            with open(self.path, "w", encoding="utf-8") as out:
                for i, fam in enumerate(self._families):
                    part = self._dir / f"{i:03d}"
                    if part.stat().st_size == 0:
                        continue
                    out.write(f"# HELP {fam} {self._help[fam]}\n# TYPE {fam} gauge\n")
                    with open(part, encoding="utf-8") as fh:
                        shutil.copyfileobj(fh, out, 1 << 20)
                out.write("# EOF\n")
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        return self.path
