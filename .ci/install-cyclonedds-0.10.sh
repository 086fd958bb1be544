#!/usr/bin/env bash
# Installs Debian's Cyclone DDS 0.10.2 (C library, headers, idlc) for the DDS interoperability test,
# which builds a small C peer against it, and cyclonedds-python 0.10.2 built against that library
# into its own directory ($BCG_CYCLONEDDS_010, default ~/.cache/bcg/cyclonedds-0.10.2; used with
# PYTHONPATH), the fallback binding for the robot path. The pip-installed cyclonedds 11.x is left
# alone. Idempotent: returns at once when everything is there. Never fails the CI run: what cannot
# be installed makes the tests that need it skip and say why.
set -u
BINDING_DIR="${BCG_CYCLONEDDS_010:-$HOME/.cache/bcg/cyclonedds-0.10.2}"
binding_ok() { [ -f "$BINDING_DIR/cyclonedds/__init__.py" ] && ls "$BINDING_DIR"/cyclonedds-0.10.2*.dist-info >/dev/null 2>&1; }
install_binding() {
  binding_ok && return 0
  # setup.py of 0.10.2 wants CYCLONEDDS_HOME/{include,lib,bin}; Debian splits them, so link them.
  home="$(mktemp -d)"
  ln -s /usr/include "$home/include"
  ln -s "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)" "$home/lib"
  ln -s /usr/bin "$home/bin"
  tmp="$BINDING_DIR.tmp.$$"
  if CYCLONEDDS_HOME="$home" python -m pip install -q --no-deps --no-binary cyclonedds --target "$tmp" \
      cyclonedds==0.10.2 >/dev/null 2>&1; then
    rm -rf "$BINDING_DIR" && mkdir -p "$(dirname "$BINDING_DIR")" && mv "$tmp" "$BINDING_DIR"
  else
    rm -rf "$tmp"
    echo "install-cyclonedds-0.10: building cyclonedds-python 0.10.2 failed; its test will skip" >&2
  fi
  rm -rf "$home"
}
PKGS="cyclonedds-dev libddsc0debian cyclonedds-tools"
installed() {
  for p in $PKGS; do
    dpkg-query -W -f='${Status} ${Version}\n' "$p" 2>/dev/null | grep -q '^install ok installed 0\.10\.' || return 1
  done
}
if installed; then
  install_binding
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
if installed; then
  install_binding
else
  echo "install-cyclonedds-0.10: installed packages are not 0.10.x; the interop test will skip" >&2
fi
exit 0
