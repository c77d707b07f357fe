#!/usr/bin/env bash
# Installs the Debian packages kvpage needs, only those that are missing.
# Does nothing when all are present. Run as a non-root user, it prints the exact command instead.
#
# Python: the project's scripts (papers/*/reproduce.py, bench/plot.py, scripts/run-docs.py, ...) run on Debian's
# /usr/bin/python3, whatever `python3` is first on PATH (a pyenv or a venv): their first line names it, `kvpage
# bench` plots with it, and CTest runs them with it (CMake's KVPAGE_PYTHON). Its matplotlib is python3-matplotlib.
set -eu
py=/usr/bin/python3

pkgs=(
  build-essential cmake pkg-config
  libcjson-dev libjemalloc-dev libcriterion-dev libopenblas-dev
  libopenmpi-dev openmpi-bin libxxhash-dev libmicrohttpd-dev libpcre2-dev libcurl4-openssl-dev
  python3 python3-matplotlib curl
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

check_python() {
  if ! "$py" -c 'import matplotlib' 2>/dev/null; then
    echo "kvpage: $py cannot import matplotlib (python3-matplotlib is installed for Debian's python3 only)" >&2
    exit 1
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  check_python
  exit 0
fi

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "kvpage: missing Debian packages: ${missing[*]}" >&2
  echo "kvpage: run as root:  apt-get update && $cmd" >&2
  exit 1
fi
echo "kvpage: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
$cmd >&2
check_python
