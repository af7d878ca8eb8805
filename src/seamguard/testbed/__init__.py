"""Real servers for tests, benchmarks and demos: Prometheus, munged + slurmctld.

Product code, not test scaffolding: each helper starts a real Debian-packaged server on
loopback with temporary state, waits until it answers, and stops it (also on failure).
A missing binary raises `MissingBinary` naming the package to install — never a skip.
"""
