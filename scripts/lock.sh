#!/usr/bin/env bash
# Re-resolve the test toolchain in a fresh virtual environment and rewrite
# requirements/test-constraints.txt. Run deliberately (a dependency upgrade), then run the
# whole suite with scripts/test.sh and commit the new lock with what it changed.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d); trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test,runtime,service,gateway]'
{
  head -n 3 requirements/test-constraints.txt
  "$venv/bin/python" -m pip freeze --exclude-editable | grep -v '^torch=='
} > requirements/test-constraints.txt.new
mv requirements/test-constraints.txt.new requirements/test-constraints.txt
git --no-pager diff --stat requirements/test-constraints.txt || true
