#!/usr/bin/env bash
# A RabbitMQ 4.x node without Docker, beside the 3.10 node of scripts/broker.sh, in a
# debootstrap chroot. Two variants share this script (scripts/broker43.sh picks the second):
#
#   AMQPJOBS_BROKER4_VARIANT=40 (default)  Debian 13 (trixie) rabbitmq-server 4.0.x, under <repo>/.broker4/,
#       node amqpjobs4@localhost, ports AMQPJOBS_BROKER4_PORT (5692), _MGMT_PORT (15692), _DIST_PORT (25692), epmd 4370
#   AMQPJOBS_BROKER4_VARIANT=43            Debian unstable (sid) rabbitmq-server pinned to 4.3.x, under <repo>/.broker43/,
#       node amqpjobs43@localhost, ports AMQPJOBS_BROKER43_PORT (5712), _MGMT_PORT (15712), _DIST_PORT (25712), epmd 4371
#       (not 5701-5703 / 15701-15703 / 25701-25703: scripts/cluster.sh's nodes)
#
#   scripts/broker4.sh up          build the chroot when missing, start the node, wait; print URLs (masked)
#   scripts/broker4.sh build       only build the chroot and install the package (make test overlaps it with a suite)
#   scripts/broker4.sh down        stop the node this script started
#   scripts/broker4.sh status      "up (chroot node ..., RabbitMQ X.Y.Z)" (exit 0) or "down" (exit 3)
#   scripts/broker4.sh url         two lines: AMQP URL (with credentials), management URL
#   scripts/broker4.sh ctl ARGS... rabbitmqctl ARGS... against that node
#
# When a RabbitMQ node already answers on those ports with guest/guest and it is not this
# checkout's (another clone's), `up` uses it and says so in one line (no chroot is built, no
# node started); `down` then leaves it running (and its epmd), `ctl` refuses.
#
# Needs root (debootstrap, chroot). All listeners on 127.0.0.1 (AMQP, management, Erlang
# distribution, epmd); each variant has its own epmd port, so neither meets the host's 3.10
# node's epmd nor the other variant's.
# Only /proc is mounted into the chroot (never the host's /dev: a later rm -rf of the
# chroot would delete the host's device files). `down` unmounts it.
# sid needs two extra steps, done for both variants: its Release file may be past its
# Valid-Until on the mirror (apt option Acquire::Check-Valid-Until=false), and its minbase
# chroot has no /etc/hosts, without which the node dies with {epmd_error,"localhost",nxdomain}.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
VARIANT=${AMQPJOBS_BROKER4_VARIANT:-40}
case "$VARIANT" in
  40)
    NAME=broker4; SUITE=trixie; DEBIAN="Debian 13"; PIN=4.0
    PORT=${AMQPJOBS_BROKER4_PORT:-5692}
    MPORT=${AMQPJOBS_BROKER4_MGMT_PORT:-15692}
    DPORT=${AMQPJOBS_BROKER4_DIST_PORT:-25692}
    EPMD_PORT=4370 ;;
  43)
    NAME=broker43; SUITE=sid; DEBIAN="Debian unstable (sid)"; PIN=4.3
    PORT=${AMQPJOBS_BROKER43_PORT:-5712}
    MPORT=${AMQPJOBS_BROKER43_MGMT_PORT:-15712}
    DPORT=${AMQPJOBS_BROKER43_DIST_PORT:-25712}
    EPMD_PORT=4371 ;;
  *) printf 'broker4: error: AMQPJOBS_BROKER4_VARIANT=%s: use 40 or 43\n' "$VARIANT" >&2; exit 2 ;;
esac
DIR=$ROOT/.$NAME
CH=$DIR/root
NODE=amqpjobs${VARIANT%0}@localhost
# shellcheck source=other-node.sh
. "$ROOT/scripts/other-node.sh"

log() { printf '%s: %s\n' "$NAME" "$*" >&2; }
die() { printf '%s: error: %s\n' "$NAME" "$*" >&2; exit 1; }
mask() { sed -E 's#://([^:/@]*):[^@]*@#://\1:***@#'; }

# The host's Debian mirror (first ".../debian" URI of an active apt source), else debootstrap's default.
mirror() {
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
    grep -vE '^\s*#' | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -1 | tr -d ' ' || true
}

in_root() {
  chroot "$CH" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
    RABBITMQ_NODENAME=$NODE RABBITMQ_DIST_PORT=$DPORT ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" bash -c "$1"
}

mount_proc() { mountpoint -q "$CH/proc" || mount -t proc proc "$CH/proc"; }

# Install rabbitmq-server $PIN.x, or stop with what the mirror offers instead.
install_pinned() {
  log "installing rabbitmq-server $PIN.x from $SUITE in the chroot ..."
  in_root "apt-get -o Acquire::Check-Valid-Until=false update -qq" >&2 || die "apt-get update failed in the $SUITE chroot"
  local versions version
  versions=$(in_root "apt-cache madison rabbitmq-server" | awk -F'|' '{gsub(/ /, "", $2); print $2}')
  version=$(grep -E "^([0-9]+:)?${PIN//./\\.}\\." <<<"$versions" | head -1 || true)
  [ -n "$version" ] || die "the $SUITE mirror ($(mirror)) has no rabbitmq-server $PIN.x (it offers: ${versions:-none}); \
point the host's apt source at a mirror or snapshot (snapshot.debian.org) that still has it, then rm -rf $DIR and retry"
  in_root "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rabbitmq-server=$version >/dev/null" ||
    die "installing rabbitmq-server=$version failed"
}

build() {
  [ "$(id -u)" = 0 ] || die "needs root (debootstrap and chroot)"
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap ..."
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >&2
  fi
  mkdir -p "$DIR"
  if [ ! -x "$CH/usr/bin/apt-get" ]; then
    log "building a $DEBIAN chroot in $CH (about 30 s) ..."
    rm -rf "$CH"
    debootstrap --variant=minbase "$SUITE" "$CH" "$(mirror)" >"$DIR/debootstrap.log" 2>&1 ||
      { tail -20 "$DIR/debootstrap.log" >&2; die "debootstrap failed"; }
  fi
  mount_proc
  cp /etc/resolv.conf "$CH/etc/resolv.conf" 2>/dev/null || true
  grep -qs '^127\.0\.0\.1[[:space:]].*localhost' "$CH/etc/hosts" || echo "127.0.0.1 localhost" >>"$CH/etc/hosts"
  [ -x "$CH/usr/sbin/rabbitmq-server" ] || install_pinned
  cat >"$CH/etc/rabbitmq/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $MPORT
CONF
  if [ "$VARIANT" = 43 ]; then
    # 4.3 denies global_qos and CQv1 by default; deny the last deprecated feature we could touch
    # too (4.3.6 still permits transient non-exclusive queues), so the suite proves we use none
    echo "deprecated_features.permit.transient_nonexcl_queues = false" >>"$CH/etc/rabbitmq/rabbitmq.conf"
  fi
  cat >"$CH/etc/rabbitmq/rabbitmq-env.conf" <<ENV
ERL_EPMD_PORT=$EPMD_PORT
ERL_EPMD_ADDRESS=127.0.0.1
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
ENV
  in_root "rabbitmq-plugins --offline enable rabbitmq_management rabbitmq_consistent_hash_exchange >/dev/null"
}

answers() { curl -fsS --max-time 5 -u guest:guest "http://127.0.0.1:$MPORT/api/overview" >/dev/null 2>&1; }

url() {
  echo "amqp://guest:guest@127.0.0.1:$PORT/"
  echo "http://127.0.0.1:$MPORT/"
}

# Our own node answers: the chroot is built and its rabbitmqctl (our cookie) reaches the node.
own_node_runs() {
  [ -x "$CH/usr/sbin/rabbitmqctl" ] && mount_proc && in_root "rabbitmqctl -n $NODE -q status >/dev/null 2>&1"
}
reused() { [ -f "$DIR/reused" ]; }   # `up` found another checkout's node on our ports and uses it

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build) build ;;
  up)
    if found=$(other_node "$PORT" "$MPORT") && ! own_node_runs; then
      mkdir -p "$DIR"
      printf '%s\n' "$found" >"$DIR/reused"
      using_other_node "$NAME" "$PORT" "$found" "scripts/$NAME.sh down"
      url | mask
      exit 0
    fi
    rm -f "$DIR/reused"
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
    if reused; then
      found=$(cat "$DIR/reused")
      log "leaving node ${found%% *} running: this checkout did not start it (it was already answering on 127.0.0.1:$PORT)"
      rm -f "$DIR/reused"
      exit 0
    fi
    if [ -x "$CH/usr/sbin/rabbitmqctl" ]; then
      mount_proc
      in_root "rabbitmqctl -n $NODE -q stop >/dev/null 2>&1" || true
      in_root "epmd -port $EPMD_PORT -kill >/dev/null 2>&1" || true
    fi
    if mountpoint -q "$CH/proc"; then umount "$CH/proc" || umount -l "$CH/proc"; fi ;;
  status)
    if reused; then
      if found=$(other_node "$PORT" "$MPORT") && [ "${found%% *}" = "$(cut -d' ' -f1 "$DIR/reused")" ]; then
        echo "up (RabbitMQ node ${found%% *} on 127.0.0.1:$PORT, not started by this checkout, RabbitMQ ${found#* })"
      else
        echo down; exit 3
      fi
    elif [ -x "$CH/usr/sbin/rabbitmqctl" ] && answers; then
      echo "up (chroot node $NODE, RabbitMQ $(in_root "rabbitmq-diagnostics -n $NODE -q server_version" 2>/dev/null))"
    else
      echo down; exit 3
    fi ;;
  url) url ;;
  ctl)
    if reused; then
      die "node $(cut -d' ' -f1 "$DIR/reused") was not started by this checkout (scripts/$NAME.sh up found it running on 127.0.0.1:$PORT); run rabbitmqctl where it was started (its checkout's scripts/$NAME.sh ctl), or use its management UI http://127.0.0.1:$MPORT/"
    fi
    # files given to import_definitions live on the host: copy them into the chroot first
    if [ "${1:-}" = import_definitions ] && [ -f "${2:-}" ]; then
      cp "$2" "$CH/tmp/amqpjobs-definitions.json"
      set -- import_definitions /tmp/amqpjobs-definitions.json "${@:3}"
    fi
    mount_proc
    args=$(printf '%q ' "$@")
    in_root "rabbitmqctl -n $NODE $args" ;;
  *) echo "usage: $0 up|build|down|status|url|ctl ARGS..." >&2; exit 2 ;;
esac
