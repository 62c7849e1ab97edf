#!/usr/bin/env bash
# mypy --strict on the compiler. The source folders map onto one package (compiler/ is
# mxc.compiler), so mypy reads them through a shadow tree of symlinks with that layout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mypy=${MYPY:-mypy}
case $mypy in */*) mypy="$(cd "$(dirname "$mypy")" && pwd)/$(basename "$mypy")" ;; esac  # we cd below
shadow=$(mktemp -d)
trap 'rm -rf "$shadow"' EXIT
mkdir -p "$shadow/mxc"
for f in "$root"/mxc/*.py; do ln -s "$f" "$shadow/mxc/"; done
ln -s "$root/mxc/cli" "$shadow/mxc/cli"
for pkg in compiler runtime plugins; do ln -s "$root/$pkg" "$shadow/mxc/$pkg"; done
cd "$shadow"
"$mypy" --config-file "$root/pyproject.toml" -p "${1:-mxc.compiler}"
