#!/usr/bin/env bash
# `make image`: the Dockerfile built where no image registry is reachable, in three layers, each
# kept and made again only when what it is made of changes:
#   1. a Debian base made here (debootstrap minbase bookworm + the host's CA bundle, docker
#      import), its packages and its root filesystem cached under $SWARMLOAD_CACHE;
#   2. the Python packages of requirements.lock installed on it by uv from this host's uv cache
#      (the wheels `make setup` already fetched; nothing is downloaded when they are there),
#      committed as swarmload-deps:<key of base, lock and pyproject.toml>;
#   3. `docker build` of the Dockerfile FROM that (its pip finds every dependency installed).
# Exit 3: it cannot be done here (no daemon answers); the image test skips with that line.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${BASE_IMAGE:-swarmload-base:bookworm}
IMAGE=${IMAGE:-swarmload:latest}
CACHE=${SWARMLOAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/swarmload}
SUITE=bookworm
INCLUDE=python3,python3-pip,ca-certificates
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
UV=${UV:-$(command -v uv || echo .venv/bin/uv)}

say() { echo "image.sh: $*"; }
docker info >/dev/null 2>&1 || { say "no docker daemon answers (start dockerd)"; exit 3; }
mkdir -p "$CACHE"

make_base() {
    # the root filesystem's tar is kept, keyed by what goes into it: a lost image is imported again
    # in seconds; the packages are kept too (debootstrap --cache-dir), for a new suite or bundle
    local key tar rootfs
    key=$(printf '%s %s %s' "$SUITE" "$INCLUDE" "$(sha256sum < "$CA_BUNDLE")" | sha256sum | cut -c1-12)
    tar="$CACHE/base-$SUITE-$key.tar"
    if [ ! -s "$tar" ]; then
        [ "$(id -u)" = 0 ] || { say "making the base needs root (debootstrap)"; exit 3; }
        command -v debootstrap >/dev/null || {
            apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=300 debootstrap; }
        rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
        mkdir -p "$CACHE/debs"
        debootstrap --variant=minbase --cache-dir="$CACHE/debs" --include="$INCLUDE" \
            "$SUITE" "$rootfs" >"$CACHE/debootstrap.log" 2>&1 ||
            { tail -20 "$CACHE/debootstrap.log"; rm -rf "$rootfs"; exit 1; }
        # pip and uv inside trust what this host trusts (its network may re-sign TLS)
        cp "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
        rm -f "$CACHE"/base-"$SUITE"-*.tar
        tar -C "$rootfs" -cf "$tar.part" . && mv "$tar.part" "$tar"
        rm -rf "$rootfs"
    fi
    docker import --change "ENV PIP_CERT=$CA_BUNDLE" "$tar" "$BASE_IMAGE" >/dev/null
}

make_deps() { # DEPS_TAG: the lock's packages on the base, from the host's uv cache
    local name=swarmload-deps-$$ cache
    cache=$("$UV" cache dir) && mkdir -p "$cache" || return 1
    docker rm -f "$name" >/dev/null 2>&1 || true
    # /tmp is a tmpfs in the container: the mount points leave nothing in the committed layer;
    # --offline first (the cache has it all after `make setup`), the index only if it lacks some;
    # what uv adds to the cache is given back to its owner (the container runs as root)
    local install=(/tmp/uv pip install --system --break-system-packages --compile-bytecode
                   -c /tmp/requirements.lock -r /tmp/pyproject.toml)
    # --network host: a container on the bridge adds a veth to the host, and Chromium drops every
    # request in flight on a network change (net::ERR_NETWORK_CHANGED): make test builds this
    # beside the browser tests
    docker run --name "$name" --network host --tmpfs /tmp \
        -v "$(readlink -f "$UV")":/tmp/uv:ro -v "$cache":/tmp/uv-cache \
        -v "$PWD/requirements.lock":/tmp/requirements.lock:ro \
        -v "$PWD/pyproject.toml":/tmp/pyproject.toml:ro \
        "$BASE_IMAGE" env UV_CACHE_DIR=/tmp/uv-cache UV_LINK_MODE=copy UV_SYSTEM_CERTS=1 \
        SSL_CERT_FILE="$CA_BUNDLE" OWNER="$(id -u):$(id -g)" sh -c '"$@" --offline || "$@"
            s=$?; [ "$OWNER" = 0:0 ] || chown -R "$OWNER" /tmp/uv-cache; exit $s' sh "${install[@]}" &&
        docker commit --change 'CMD ["python3"]' "$name" "$1" >/dev/null
    local status=$?
    docker rm "$name" >/dev/null 2>&1 || true
    return $status
}

# each step a plain command (not in an || list), so that set -e stops the script inside it
if [ -z "$(docker images -q "$BASE_IMAGE")" ]; then
    start=$SECONDS
    make_base
    say "base $BASE_IMAGE took $((SECONDS - start)) s"
fi
from=$BASE_IMAGE
if [ -x "$UV" ]; then
    key=$( (docker image inspect -f '{{.Id}}' "$BASE_IMAGE"; cat requirements.lock pyproject.toml;
            "$UV" --version || true) | sha256sum | cut -c1-12)
    if [ -z "$(docker images -q "swarmload-deps:$key")" ]; then
        start=$SECONDS
        if make_deps "swarmload-deps:$key"; then
            say "packages swarmload-deps:$key took $((SECONDS - start)) s"
            from=swarmload-deps:$key
        else
            say "uv could not install the lock: pip inside the build downloads it (minutes)"
        fi
    else
        from=swarmload-deps:$key
    fi
else
    say "no uv ($UV): pip inside the build downloads every package (minutes)"
fi
previous=$(docker images -q "$IMAGE")
start=$SECONDS
docker build --network host --build-arg BASE_IMAGE="$from" -t "$IMAGE" .  # host: as above
say "image $IMAGE took $((SECONDS - start)) s"
# what this replaced goes: the image built before (unless a container still uses it), then the
# packages of an older lock or base
if [ -n "$previous" ] && [ "$previous" != "$(docker images -q "$IMAGE")" ]; then
    docker rmi "$previous" >/dev/null 2>&1 || true
fi
docker images swarmload-deps --format '{{.Repository}}:{{.Tag}}' | grep -vxF "$from" |
    xargs -r docker rmi >/dev/null 2>&1 || true
