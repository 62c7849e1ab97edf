#!/usr/bin/env bash
# mypy --strict (settings in pyproject.toml) on the given packages or paths; default: the mxc package.
set -euo pipefail
cd "$(dirname "$0")/.."
"${MYPY:-mypy}" "${@:-mxc}"
