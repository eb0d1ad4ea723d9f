#!/usr/bin/env bash
# Instructions the program and the baseline execute for NODES nodes, counted by callgrind in the
# timed part only. Wall-clock ratios on a shared machine drift by 20% between minutes; these
# counts repeat to 0.2%, which makes them the measure for comparing two versions of the code.
#   scripts/bench_instructions.sh 50     (needs valgrind; about a minute per side at 50 nodes)
set -euo pipefail
nodes=${1:?usage: scripts/bench_instructions.sh NODES}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
count() {  # $1: program or baseline
  (cd "$root" && valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/$1.out" \
    .venv/bin/python -m offline.bench --worker "$1" --nodes "$nodes" --callgrind >/dev/null 2>"$work/$1.log")
  callgrind_annotate "$work/$1.out" | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}
count program >"$work/program" &
program_pid=$!
count baseline >"$work/baseline"
wait "$program_pid"
program=$(cat "$work/program") baseline=$(cat "$work/baseline")
echo "nodes=$nodes program=$program baseline=$baseline ratio=$(python3 -c "print(round($program / $baseline, 3))")"
