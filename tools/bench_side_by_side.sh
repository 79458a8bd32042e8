#!/bin/bash
# `make bench` before and after a change, module by module, side by side (the machine is
# shared and noisy: each module's two runs follow each other).
#   tools/bench_side_by_side.sh BEFORE_TREE AFTER_TREE [MODULE...]
# e.g. git worktree add --detach /tmp/before b8271c4
#      tools/bench_side_by_side.sh /tmp/before "$PWD" > bench.log
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_TREE AFTER_TREE [MODULE...]  (a tree: a checkout of this repository)" >&2
  exit 2
fi
before=$1 after=$2
shift 2
py=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python
modules=${*:-bench_compiler bench_engine bench_ledger bench_finance bench_daemon bench_slurm bench_workers bench_whatif bench_web bench_failover bench_state}
for m in $modules; do
  for dir in "$before" "$after"; do
    echo "=== $m $dir $(date -u +%H:%M:%S)"
    (cd "$dir" && PATH="$(dirname "$py"):$PATH" PYTHONPATH="$dir" "$py" -m tests.bench "$m" 2>&1 |
      grep -E "^\||running|Error|error" | grep -v "^| benchmark\|^| ---")
  done
done
echo "=== done $(date -u +%H:%M:%S)"
