#!/usr/bin/env bash
# Render every stack on BASE_REF and on the working tree, and print a Markdown diff per stack.
# Used by .github/workflows/preview.yml; runs locally too: scripts/render_diff.sh origin/main
set -euo pipefail
base_ref=${1:?usage: scripts/render_diff.sh BASE_REF}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --quiet --detach "$work/base" "$base_ref"

render_all() {  # $1: checkout, $2: output root, $3: where to keep each stack's summary (--json), if given.
  # The checkout's own program renders its own stacks.
  module=offline.render
  [ -e "$1/offline/render.py" ] || module=tools.render  # checkouts from before the layout change
  for stack_file in "$1"/stacks/Pulumi.*.yaml; do
    [ -e "$stack_file" ] || continue
    stack=${stack_file##*/Pulumi.}; stack=${stack%.yaml}
    if [ -n "${3:-}" ]; then
      (cd "$1" && "$root/.venv/bin/python" -m "$module" --stack-file "$stack_file" --out "$2/$stack" --json >"$3/$stack.json")
    else
      (cd "$1" && "$root/.venv/bin/python" -m "$module" --stack-file "$stack_file" --out "$2/$stack" >/dev/null)
    fi
  done
}
mkdir -p "$work/out/base" "$work/out/head" "$work/summary"
render_all "$work/base" "$work/out/base"
render_all "$root" "$work/out/head" "$work/summary"

# This change's render summary of a stack, as `make render` prints it: the per-node table, quotas, guard and
# each node's GPUs one mark each, in stack order (offline/render.py's summary, from its --json). Its first line
# says how many objects; not where they were written: this job's render directory is gone with its runner.
summary() {
  "$root/.venv/bin/python" -c '
import json, sys
from offline.render import summary
data = json.load(open(sys.argv[1], encoding="utf-8"))
lines = summary({**data, "out": ""}).splitlines()
first = "stack {}: {} objects with this change".format(data["stack"], data["objects"])
print("\n".join([first, *lines[1:]]))
' "$1"
}

echo "<!-- hidden-gpu render diff -->"
echo "### Rendered Kubernetes objects: $base_ref → this change"
for stack in $(ls "$work/out/base" "$work/out/head" | grep -v ':$' | sort -u); do
  mkdir -p "$work/out/base/$stack" "$work/out/head/$stack"
  echo
  echo "**stack \`$stack\`**"
  echo '```diff'
  "$root/.venv/bin/python" -m offline.diff "$work/out/base/$stack" "$work/out/head/$stack"
  echo '```'
  if [ -e "$work/summary/$stack.json" ]; then
    echo
    echo "GPUs per node with this change (one mark per GPU, in stack order):"
    echo '```text'
    (cd "$root" && summary "$work/summary/$stack.json")
    echo '```'
  else
    echo
    echo "stack \`$stack\` is removed by this change"
  fi
done
