#!/usr/bin/env bash
# A RabbitMQ 4.x node without Docker, beside the 3.10 node of scripts/broker.sh:
# Debian 13 (trixie)'s rabbitmq-server in a debootstrap chroot under <repo>/.broker4/.
#
#   scripts/broker4.sh up          build the chroot when missing, start the node, wait; print URLs (masked)
#   scripts/broker4.sh down        stop the node this script started
#   scripts/broker4.sh status      "up (chroot node ..., RabbitMQ X.Y.Z)" (exit 0) or "down" (exit 3)
#   scripts/broker4.sh url         two lines: AMQP URL (with credentials), management URL
#   scripts/broker4.sh ctl ARGS... rabbitmqctl ARGS... against that node
#
# Needs root (debootstrap, chroot). Ports: AMQPJOBS_BROKER4_PORT (5692), AMQPJOBS_BROKER4_MGMT_PORT
# (15692), AMQPJOBS_BROKER4_DIST_PORT (25692); all listeners on 127.0.0.1.
# Only /proc is mounted into the chroot (never the host's /dev: a later rm -rf of the
# chroot would delete the host's device files). `down` unmounts it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
CH=$ROOT/.broker4/root
PORT=${AMQPJOBS_BROKER4_PORT:-5692}
MPORT=${AMQPJOBS_BROKER4_MGMT_PORT:-15692}
DPORT=${AMQPJOBS_BROKER4_DIST_PORT:-25692}
NODE=amqpjobs4@localhost

log() { printf 'broker4: %s\n' "$*" >&2; }
die() { printf 'broker4: error: %s\n' "$*" >&2; exit 1; }
mask() { sed -E 's#://([^:/@]*):[^@]*@#://\1:***@#'; }

# The host's Debian mirror (first ".../debian" URI of an active apt source), else debootstrap's default.
mirror() {
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
    grep -vE '^\s*#' | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -1 | tr -d ' ' || true
}

in_root() {
  chroot "$CH" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
    RABBITMQ_NODENAME=$NODE RABBITMQ_DIST_PORT=$DPORT ERL_EPMD_PORT=4370 bash -c "$1"
}

mount_proc() { mountpoint -q "$CH/proc" || mount -t proc proc "$CH/proc"; }

build() {
  [ "$(id -u)" = 0 ] || die "needs root (debootstrap and chroot)"
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap ..."
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
  fi
  mkdir -p "$ROOT/.broker4"
  if [ ! -x "$CH/usr/bin/apt-get" ]; then
    log "building a Debian 13 chroot in $CH (about 30 s) ..."
    rm -rf "$CH"
    debootstrap --variant=minbase trixie "$CH" "$(mirror)" >"$ROOT/.broker4/debootstrap.log" 2>&1 ||
      { tail -20 "$ROOT/.broker4/debootstrap.log" >&2; die "debootstrap failed"; }
  fi
  mount_proc
  cp /etc/resolv.conf "$CH/etc/resolv.conf" 2>/dev/null || true
  if [ ! -x "$CH/usr/sbin/rabbitmq-server" ]; then
    log "installing rabbitmq-server 4.x in the chroot ..."
    in_root "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rabbitmq-server >/dev/null"
  fi
  cat >"$CH/etc/rabbitmq/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $MPORT
CONF
  # the chroot's own epmd on another port, so it never meets the host's 3.10 node's epmd
  echo "ERL_EPMD_PORT=4370" >"$CH/etc/rabbitmq/rabbitmq-env.conf"
  in_root "rabbitmq-plugins --offline enable rabbitmq_management rabbitmq_consistent_hash_exchange >/dev/null"
}

answers() { curl -fsS --max-time 5 -u guest:guest "http://127.0.0.1:$MPORT/api/overview" >/dev/null 2>&1; }

url() {
  echo "amqp://guest:guest@127.0.0.1:$PORT/"
  echo "http://127.0.0.1:$MPORT/"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up)
    build
    if ! in_root "rabbitmqctl -n $NODE -q status >/dev/null 2>&1"; then
      log "starting $NODE on 127.0.0.1:$PORT (management $MPORT) ..."
      in_root "nohup rabbitmq-server >/var/log/rabbitmq/console.log 2>&1 &"
    fi
    for _ in $(seq 1 60); do
      in_root "rabbitmqctl -n $NODE -q await_startup --timeout 5 >/dev/null 2>&1" && answers && break
      sleep 2
    done
    answers || { tail -30 "$CH/var/log/rabbitmq/console.log" >&2 || true; die "the node did not come up"; }
    url | mask ;;
  down)
    if [ -x "$CH/usr/sbin/rabbitmqctl" ]; then
      mount_proc
      in_root "rabbitmqctl -n $NODE -q stop >/dev/null 2>&1" || true
      in_root "epmd -port 4370 -kill >/dev/null 2>&1" || true
    fi
    if mountpoint -q "$CH/proc"; then umount "$CH/proc" || umount -l "$CH/proc"; fi ;;
  status)
    if [ -x "$CH/usr/sbin/rabbitmqctl" ] && answers; then
      echo "up (chroot node $NODE, RabbitMQ $(in_root "rabbitmq-diagnostics -n $NODE -q server_version" 2>/dev/null))"
    else
      echo down; exit 3
    fi ;;
  url) url ;;
  ctl)
    # files given to import_definitions live on the host: copy them into the chroot first
    if [ "${1:-}" = import_definitions ] && [ -f "${2:-}" ]; then
      cp "$2" "$CH/tmp/amqpjobs-definitions.json"
      set -- import_definitions /tmp/amqpjobs-definitions.json "${@:3}"
    fi
    mount_proc
    args=$(printf '%q ' "$@")
    in_root "rabbitmqctl -n $NODE $args" ;;
  *) echo "usage: $0 up|down|status|url|ctl ARGS..." >&2; exit 2 ;;
esac
