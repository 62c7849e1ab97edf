#!/usr/bin/env bash
# lock_setup.sh - resolve the set-up locks with uv: lockfiles/requirements-{mxc,dev}.in -> .txt, and
# requirements-bootstrap.txt (uv alone, at the version the locks pin). Every package is pinned with
# the sha256 of each of its files (CPython 3.12, Linux x86-64), constrained by requirements-train.txt
# so that the training lock and the set-up locks agree on every shared package.
#   UV=/path/to/uv tools/lock_setup.sh        # default: .venv/bin/uv
# Review the diff; scripts/setup.sh installs these files with --require-hashes.
set -euo pipefail
cd "$(dirname "$0")/../lockfiles"
uv=${UV:-$PWD/../.venv/bin/uv}
common=(--generate-hashes --python-version 3.12 --python-platform x86_64-manylinux_2_28 --quiet
        --custom-compile-command "tools/lock_setup.sh")
for name in mxc dev; do
  "$uv" pip compile "requirements-$name.in" -c requirements-train.txt "${common[@]}" -o "requirements-$name.txt"
done
version=$(sed -n 's/^uv==\([^ ]*\).*/\1/p' requirements-mxc.txt)
printf 'uv==%s\n' "$version" > .bootstrap.in
"$uv" pip compile .bootstrap.in "${common[@]}" -o requirements-bootstrap.txt
rm -f .bootstrap.in
echo "lockfiles: requirements-mxc.txt, requirements-dev.txt, requirements-bootstrap.txt (uv $version)"
