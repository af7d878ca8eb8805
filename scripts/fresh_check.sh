#!/usr/bin/env bash
# The README's two set-up commands, exactly as written, from a fresh clone of the committed
# HEAD in a fresh virtual environment — what a new user (and CI on a new machine) gets.
# usage: bash scripts/fresh_check.sh [--demo-only]
set -uo pipefail
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel) || exit 2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/clone" && python3 -m venv "$work/venv" || { echo "fresh_check: clone or venv failed"; exit 1; }
cd "$work/clone" && . "$work/venv/bin/activate"
# The first fenced shell lines of the README that run the demo and the tests.
demo_cmd=$(grep -m1 -E '^pip install .*seamguard demo' README.md)
test_cmd=$(grep -m1 -E '^bash scripts/test\.sh' README.md)
[ -n "$demo_cmd" ] && [ -n "$test_cmd" ] || { echo "fresh_check: README lacks its two set-up commands"; exit 1; }
run() {
  local name=$1 cmd=$2 t0=$SECONDS
  echo "== $cmd"
  bash -c "$cmd" >"$work/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0)) s: $(grep -E '[0-9]+ passed|detected' "$work/$name.log" | tail -n 1 | cut -c1-160)"
  [ $rc -eq 0 ] || { tail -n 30 "$work/$name.log"; exit 1; }
}
run demo "$demo_cmd"
[ "${1:-}" = "--demo-only" ] && exit 0
run test "$test_cmd"
