"""A small cluster on one machine, for tests, benchmarks and demos (product code).

- `net`, `job`, `telemetry`, `metrics`, `demo`, `cli`: H hosts as network namespaces
  with R rails each (a Linux bridge per rail as the leaf switch), a management network,
  and reversible faults (flap a rail, fail a rail's switch, make a link gray with tbf);
  `seamguard testbed up|down|clean|demo`.
- `prom`, `slurm`: real Debian-packaged servers (Prometheus, munged + slurmctld) started
  on loopback with temporary state and stopped again, also on failure. A missing binary
  raises `MissingBinary` naming the package to install — never a skip.
"""
