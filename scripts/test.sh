#!/usr/bin/env bash
# test.sh - install everything the tests start for real, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/python -m pytest "$@"
