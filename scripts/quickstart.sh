#!/usr/bin/env bash
# quickstart.sh - install mxc and train the embedded default (a tiny MaxText model on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
mxc build specs/tiny.yaml
mxc run
mxc runs
