#!/usr/bin/env bash
# The policy pack of a pull request's base commit, so the change is judged by rules it cannot weaken:
# the whole tree of BASE_REF (the pack imports its own common/ and stack_config/) in DIR, sharing this
# checkout's .venv (PulumiPolicy.yaml: virtualenv ../.venv). Then: pulumi preview --policy-pack DIR/policy
# usage: scripts/base_policy_pack.sh BASE_REF DIR
set -euo pipefail
base=${1:?usage: scripts/base_policy_pack.sh BASE_REF DIR}
dir=${2:?usage: scripts/base_policy_pack.sh BASE_REF DIR}
if [ -e "$dir" ]; then
  echo "error: $dir exists; give a new directory" >&2
  exit 2
fi
mkdir -p "$dir"
git archive --format=tar "$base" | tar -x -C "$dir"
ln -s "$(pwd)/.venv" "$dir/.venv"
echo "$dir/policy: the policy pack of $(git rev-parse --short "$base")"
