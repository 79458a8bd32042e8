#!/bin/bash
# `make bench` before and after a change, module by module, side by side (the machine is
# shared and noisy: each module's two runs follow each other).
#   tools/bench_side_by_side.sh BEFORE_TREE AFTER_TREE [MODULE...]
# e.g. git worktree add --detach ../before b8271c4
#      tools/bench_side_by_side.sh ../before "$PWD" > bench.log
# A tree needs ../shared beside it (the traces, the Slurm and PostgreSQL notes): a benchmark
# that does not find it says so and skips (a tree under /tmp printed no what-if row at all).
# A module named twice runs twice (before, after, before, after).
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_TREE AFTER_TREE [MODULE...]  (a tree: a checkout of this repository)" >&2
  exit 2
fi
before=$1 after=$2
shift 2
py=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python
if [ ! -x "$py" ]; then # a worktree: the venv of the checkout that holds the repository
  py=$(cd "$(git -C "$(dirname "$0")" rev-parse --path-format=absolute --git-common-dir)/.." && pwd)/.venv/bin/python
fi
for dir in "$before" "$after"; do
  [ -d "$dir/../shared" ] || echo "warning: $dir/../shared is absent: benchmarks that read it skip" >&2
done
modules=${*:-bench_compiler bench_engine bench_ledger bench_finance bench_daemon bench_slurm bench_workers bench_whatif bench_web bench_failover bench_state}
for m in $modules; do
  for dir in "$before" "$after"; do
    echo "=== $m $dir $(date -u +%H:%M:%S)"
    (cd "$dir" && PATH="$(dirname "$py"):$PATH" PYTHONPATH="$dir" "$py" -m tests.bench "$m" 2>&1 |
      grep -E "^\||running|Error|error|skipped|absent" | grep -v "^| benchmark\|^| ---")
  done
done
echo "=== done $(date -u +%H:%M:%S)"
