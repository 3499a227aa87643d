#!/usr/bin/env bash
# A Docker daemon for the image test (tests/test_deploy_image.py), where none answers: Debian's
# docker.io (with docker-compose and debootstrap) installed when absent, dockerd started in the
# background (no systemd on these machines), its log in .cache/dockerd.log. It stays running.
# Only in CI (CI=true) or when asked (SWARMLOAD_DOCKERD=1, `make dockerd`): on a developer's
# machine it installs and starts nothing (Debian's docker.io would replace Docker's own packages).
# Exit 3: no daemon can be had here; the last line says what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "dockerd.sh: $*"; }
answers() { docker info >/dev/null 2>&1; }
if [ "${CI:-}" != true ] && [ "${SWARMLOAD_DOCKERD:-}" != 1 ]; then
    command -v docker >/dev/null && answers && exit 0
    say "no docker daemon answers (start dockerd, or SWARMLOAD_DOCKERD=1 to have make start one)"
    exit 3
fi
if [ "$(id -u)" != 0 ]; then
    command -v docker >/dev/null && answers && exit 0
    say "no docker daemon answers and starting dockerd needs root"
    exit 3
fi
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    start=$SECONDS
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}"; } ||
        { say "apt-get could not install ${missing[*]}"; exit 3; }
    say "installed ${missing[*]} in $((SECONDS - start)) s"
fi
answers && exit 0
mkdir -p .cache
log=$PWD/.cache/dockerd.log
# a daemon ended without its clean-up (a session's end) leaves its pid file: dockerd refuses to
# start while that pid is alive, and a new process may have it
pidfile=/var/run/docker.pid
if [ -s "$pidfile" ] && [ "$(cat "/proc/$(cat "$pidfile")/comm" 2>/dev/null)" != dockerd ]; then
    rm -f "$pidfile"
fi
start=$SECONDS
# niced: the image build and the containers it runs yield to the tests beside them
setsid nice -n 10 dockerd >"$log" 2>&1 </dev/null &
for _ in $(seq 120); do
    answers && { say "dockerd answers after $((SECONDS - start)) s (log: $log)"; exit 0; }
    kill -0 $! 2>/dev/null || break
    sleep 0.5
done
say "dockerd did not come up: $(tail -1 "$log")"
exit 3
