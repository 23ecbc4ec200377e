#!/bin/sh
# Make sure the base image has Python >= 3.11 with venv + ensurepip. python:3.11-slim already
# has them; a bare Debian/Ubuntu base gets them from apt (Debian bookworm ships Python 3.11).
# apt's output goes to a log that is printed when a step fails, so a failed build says why.
set -eu
have_python() {
    command -v python3 >/dev/null 2>&1 \
        && python3 -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null
}
if have_python && python3 -c 'import ensurepip, venv' 2>/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-python.sh: the base image has no Python >= 3.11 and no apt-get;" \
         "use a Debian-family BASE_IMAGE or one with Python 3.11+" >&2
    exit 1
fi
log=/tmp/install-python.log
# run "$@" with its output in $log; on failure print the log's last 40 lines and stop
step() {
    "$@" >"$log" 2>&1 && return 0
    rc=$?
    echo "install-python.sh: '$*' failed (exit $rc); its last lines:" >&2
    tail -n 40 "$log" >&2
    rm -f "$log"
    exit "$rc"
}
step apt-get update
step apt-get install -y --no-install-recommends python3 python3-venv
apt-get clean
rm -rf /var/lib/apt/lists/* "$log"
if ! have_python; then
    echo "install-python.sh: apt installed $(python3 --version 2>&1); FedCure needs >= 3.11" >&2
    exit 1
fi
