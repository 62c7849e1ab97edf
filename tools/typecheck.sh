#!/usr/bin/env bash
# mypy --strict (settings in pyproject.toml) on the whole tree, or on the given packages or paths.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then set -- mxc tests benchmarks tools; fi
"${MYPY:-mypy}" "$@"
