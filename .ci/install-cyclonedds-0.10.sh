#!/usr/bin/env bash
# Installs Debian's Cyclone DDS 0.10.2 (C library, headers, idlc) for the DDS interoperability test,
# which builds a small C peer against it. The Python client keeps using the pip-installed
# cyclonedds 11.x; nothing here replaces it. Idempotent: returns at once when already installed.
# Never fails the CI run: without root or apt, the interop test skips and says why.
set -u
PKGS="cyclonedds-dev libddsc0debian cyclonedds-tools"
installed() {
  for p in $PKGS; do
    dpkg-query -W -f='${Status} ${Version}\n' "$p" 2>/dev/null | grep -q '^install ok installed 0\.10\.' || return 1
  done
}
if installed; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-cyclonedds-0.10: no apt-get here; the Cyclone DDS 0.10 interop test will skip" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "install-cyclonedds-0.10: not root and no sudo; the Cyclone DDS 0.10 interop test will skip" >&2
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache policy cyclonedds-dev 2>/dev/null | grep -q 'Candidate: 0\.10\.'; then
  $SUDO apt-get update -q >/dev/null 2>&1 || true
fi
if ! $SUDO apt-get install -y -q --no-install-recommends $PKGS gcc pkg-config >/dev/null 2>&1; then
  echo "install-cyclonedds-0.10: apt-get install $PKGS failed; the interop test will skip" >&2
  exit 0
fi
installed || echo "install-cyclonedds-0.10: installed packages are not 0.10.x; the interop test will skip" >&2
exit 0
