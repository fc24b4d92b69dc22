#!/usr/bin/env bash
# The supported Pythons besides the main one (3.11, which runs everything): on each, the
# unit tests that need no cluster and one testbed slice (a cluster start with the
# testbed's certificates, the testbed's clusters, provider-file's conformance suite).
# The interpreters come with this machine kind (pyenv's 3.12 and 3.13); Debian
# bookworm and PyPI offer no 3.14 interpreter: .ci/python-3.14.sh gets one from Debian sid.
# Usage: .ci/python-versions.sh [--prepare] [3.12 3.13]
#   --prepare only creates the hatch environments (CI does it while the testbed builds).
set -euo pipefail
cd "$(dirname "$0")/.."
prepare=""
if [ "${1:-}" = "--prepare" ]; then
  prepare=yes
  shift
fi
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.12 3.13)

# shellcheck source=/dev/null
source .ci/python-slice.sh

# A directory holding only pythonX.Y links, so hatch's `python = "X.Y"` finds exactly
# that interpreter without pyenv's shims (which refuse versions not selected).
links=$(mktemp -d)
trap 'rm -rf "$links"' EXIT
for version in "${versions[@]}"; do
  found=""
  for candidate in "$(command -v "python$version" || true)" /root/.pyenv/versions/"$version".*/bin/"python$version" /usr/bin/"python$version"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c 'import ssl, venv' 2>/dev/null; then
      found=$candidate
      break
    fi
  done
  if [ -z "$found" ]; then
    echo "error: no Python $version interpreter on this machine (looked on PATH and in pyenv's versions)" >&2
    exit 1
  fi
  ln -sf "$found" "$links/python$version"
  echo "Python $version: $found ($("$found" -c 'import sys, ssl; print(sys.version.split()[0], ssl.OPENSSL_VERSION)'))"
done

if [ -n "$prepare" ]; then
  for version in "${versions[@]}"; do
    PATH="$links:$PATH" hatch env create "py${version/./}"
  done
  exit 0
fi

for version in "${versions[@]}"; do
  env="py${version/./}"
  started=$SECONDS
  echo "--- Python $version: unit tests and a testbed slice (hatch env $env)"
  PATH="$links:$PATH" hatch run "$env:all" -p no:cacheprovider -q "${unit[@]}" "${testbed[@]}"
  echo "Python $version: passed in $((SECONDS - started))s"
done
