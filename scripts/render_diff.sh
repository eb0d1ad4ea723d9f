#!/usr/bin/env bash
# Render every stack on BASE_REF and on the working tree, and print a Markdown diff per stack.
# Used by .github/workflows/preview.yml; runs locally too: scripts/render_diff.sh origin/main
set -euo pipefail
base_ref=${1:?usage: scripts/render_diff.sh BASE_REF}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --quiet --detach "$work/base" "$base_ref"

render_all() {  # $1: checkout, $2: output root. The checkout's own program renders its own stacks.
  module=offline.render
  [ -e "$1/offline/render.py" ] || module=tools.render  # checkouts from before the layout change
  for stack_file in "$1"/stacks/Pulumi.*.yaml; do
    [ -e "$stack_file" ] || continue
    stack=${stack_file##*/Pulumi.}; stack=${stack%.yaml}
    (cd "$1" && "$root/.venv/bin/python" -m "$module" --stack-file "$stack_file" --out "$2/$stack" >/dev/null)
  done
}
mkdir -p "$work/out/base" "$work/out/head"
render_all "$work/base" "$work/out/base"
render_all "$root" "$work/out/head"

echo "<!-- hidden-gpu render diff -->"
echo "### Rendered Kubernetes objects: $base_ref → this change"
for stack in $(ls "$work/out/base" "$work/out/head" | grep -v ':$' | sort -u); do
  mkdir -p "$work/out/base/$stack" "$work/out/head/$stack"
  echo
  echo "**stack \`$stack\`**"
  echo '```diff'
  "$root/.venv/bin/python" -m offline.diff "$work/out/base/$stack" "$work/out/head/$stack"
  echo '```'
done
