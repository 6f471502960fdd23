#!/usr/bin/env bash
# Installs the one system library the bundled Triton Python backend stub needs: the shared
# libpython of the Python that runs the stub (Debian: libpythonX.Y). No-op when it is present.
set -euo pipefail
py=${1:-python3}
ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if ldconfig -p | grep -q "libpython${ver}\.so\.1"; then
  exit 0
fi
echo "libpython${ver}.so.1.0 is missing; installing Debian's libpython${ver}" >&2
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && apt-get install -y -qq "libpython${ver}"
else
  echo "Install it yourself: sudo apt-get install libpython${ver}" >&2
  exit 1
fi
