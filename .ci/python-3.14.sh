#!/usr/bin/env bash
# Python 3.14, the newest the package index offers wheels for, has no interpreter on
# this machine kind (pyenv here stops at 3.13.0, Debian bookworm ships 3.11, and
# PyPI/npm carry no CPython 3.14 build that runs without a download from elsewhere).
# Debian's own archive does: sid has python3.14. So this builds a minimal sid root
# with debootstrap (from Debian's packages, about two minutes; kept for the next run),
# bind-mounts the repository and the testbed's binaries into it, and runs the same
# slice as .ci/python-versions.sh on 3.14: the no-cluster unit tests and a testbed slice.
# Needs root (chroot, mount). Usage: .ci/python-3.14.sh [--prepare]
#   --prepare only makes the root and its venv (CI does it while the testbed builds).
set -euo pipefail
prepare=""
[ "${1:-}" != "--prepare" ] || prepare=yes
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${MCRUNTIME_PY314_ROOT:-/var/cache/mcruntime-ci/sid-python3.14}
assets="${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest"
started=$SECONDS

if [ ! -x "$root/usr/bin/python3.14" ]; then
  command -v debootstrap >/dev/null 2>&1 || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  rm -rf "$root.partial"
  debootstrap --variant=minbase --include=python3.14,python3.14-venv,ca-certificates \
    sid "$root.partial" http://deb.debian.org/debian >"${TMPDIR:-/tmp}/mcruntime-debootstrap.log" 2>&1 || {
    tail -20 "${TMPDIR:-/tmp}/mcruntime-debootstrap.log" >&2
    echo "error: debootstrap of Debian sid (for python3.14) failed" >&2
    exit 1
  }
  mv "$root.partial" "$root"
fi

# The host's resolver and CA bundle (the registries may be reached through a proxy
# whose CA only the host trusts).
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/etc/ssl/certs"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
[ ! -f /etc/pip.conf ] || cp /etc/pip.conf "$root/etc/pip.conf"

mounted=()
cleanup() {
  # Unmount only what this run mounted, innermost last-in first-out; never delete
  # the root while anything may still be bound into it.
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -l "${mounted[i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT
bind() {  # bind SOURCE at the same path inside the root
  mkdir -p "$root$1"
  mount --bind "$1" "$root$1"
  mounted+=("$root$1")
}
mkdir -p "$root/proc" "$root/dev"
mount -t proc proc "$root/proc" && mounted+=("$root/proc")
mount --bind /dev "$root/dev" && mounted+=("$root/dev")
mount -t devpts devpts "$root/dev/pts" 2>/dev/null && mounted+=("$root/dev/pts") || true
bind "$repo"
bind "$assets"

in_root() {
  chroot "$root" /usr/bin/env -i HOME="$HOME" PATH=/usr/local/bin:/usr/bin:/bin \
    LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt "$@"
}
in_root /usr/bin/python3.14 -c 'import sys, ssl; print("Python", sys.version.split()[0], ssl.OPENSSL_VERSION)'

venv=/opt/mcruntime-py314
if [ ! -x "$root$venv/bin/python" ]; then
  in_root /usr/bin/python3.14 -m venv "$venv"
fi
members=()
for package in "$repo"/packages/*/; do members+=(-e "${package%/}"); done
members[1]="${members[1]}[testing]"  # packages/mcruntime-core sorts first
in_root "$venv/bin/pip" install --quiet "${members[@]}" \
  'pytest>=9.2' 'pytest-asyncio>=1.5' 'pytest-timeout>=2.4' 'hypothesis>=6.170'
if [ -n "$prepare" ]; then
  echo "Python 3.14: root and venv ready in $((SECONDS - started))s"
  exit 0
fi

# shellcheck source=/dev/null
source "$repo/.ci/python-slice.sh"
in_root /bin/sh -c "cd '$repo' && exec '$venv/bin/python' -m pytest -p no:cacheprovider -q $(printf '%q ' "${unit[@]}" "${testbed[@]}")"
echo "Python 3.14: passed in $((SECONDS - started))s"
