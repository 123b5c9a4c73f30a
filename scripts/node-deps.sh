#!/usr/bin/env bash
# Node.js for the Node publisher test (tests/integration/test_node_publisher.py):
#  - node and npm from Debian (apt-get install nodejs npm) when `command -v node` finds none
#    (needs root; CI runs as root);
#  - amqplib at the version pinned in tests/node/package-lock.json, installed with `npm ci`
#    into .cache/node (ignored by git), unless that exact lock is already installed there.
# Usage: scripts/node-deps.sh            prints the node_modules folder on stdout
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "node-deps: $*" >&2; }

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  [ "$(id -u)" = 0 ] || { log "node/npm are not installed; install them: sudo apt-get install -y nodejs npm"; exit 1; }
  log "installing nodejs and npm with apt-get ..."
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq nodejs npm >&2
fi

CACHE=.cache/node
if ! cmp -s tests/node/package-lock.json "$CACHE/package-lock.json" || [ ! -f "$CACHE/node_modules/amqplib/package.json" ]; then
  log "installing amqplib (tests/node/package-lock.json) into $CACHE with npm ci ..."
  rm -rf "$CACHE" && mkdir -p "$CACHE"
  cp tests/node/package.json tests/node/package-lock.json "$CACHE/"
  (cd "$CACHE" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
fi
echo "$PWD/$CACHE/node_modules"
