#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, then runs the whole suite.
# System packages: servers the integration tests start themselves (Prometheus, slurmctld
# and slurmd with munge, Chromium for the dashboard, Redis for shared gateway budgets, etcd for
# multi-node runtime membership and the HA controller's lease, PostgreSQL for its shared
# ledger) and iproute2 for namespaced test networks; systemd-analyze and Prometheus's promtool
# check the install artifacts in deploy/.
# torch is pinned first so pip takes the CPU wheel on disk, never a multi-GB CUDA build.
# Python packages come at the versions in requirements/test-constraints.txt (the lock;
# scripts/lock.sh re-resolves it), so a fresh machine gets what CI saw.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq prometheus slurmctld slurmd slurm-client munge chromium iproute2 redis-server etcd-server postgresql systemd >/dev/null
fi
lock=requirements/test-constraints.txt
python -m pip install -q --disable-pip-version-check -c "$lock" torch==2.13.0
python -m pip install -q --disable-pip-version-check -c "$lock" -e '.[test,runtime,service,gateway]'
python -m pytest "$@"
