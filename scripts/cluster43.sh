#!/usr/bin/env bash
# A 3-node RabbitMQ 4.3 cluster (Khepri metadata store) on loopback, for chaos tests: the
# 4.3 variant of scripts/cluster.sh. The three nodes run inside the chroot of scripts/broker43.sh
# beside its node amqpjobs43@localhost, which they never touch: own node names
# (amqpjobs43-c1..c3@localhost), data and log dirs (/var/lib/rabbitmq/cluster43/nN and
# /var/log/rabbitmq/cluster43/nN in the chroot), config files, ports and their own epmd.
#
#   scripts/cluster43.sh up          build the chroot when missing (scripts/broker43.sh build), start the 3 nodes, join them
#   scripts/cluster43.sh down        stop the three nodes and their epmd
#   scripts/cluster43.sh url N       AMQP URL and management URL of node N (1..3)
#   scripts/cluster43.sh stop N      stop node N (stop_app: the Erlang VM stays, `start N` brings it back)
#   scripts/cluster43.sh start N     start node N again (does not wait for the cluster: 2 of 3 may still be down)
#   scripts/cluster43.sh ctl N ARGS  rabbitmqctl ARGS against node N
#
# Ports of node N: AMQP 5730+N, management 15730+N, distribution 25730+N; epmd 4373
# (broker43.sh's node: 5712/15712/25712, epmd 4371; scripts/cluster.sh's 3.10 nodes: 5701-5703).
# AMQPJOBS_CLUSTER43_CHROOT: use another scripts/broker43.sh chroot (default <repo>/.broker43/root).
# Needs root (chroot).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
CH=${AMQPJOBS_CLUSTER43_CHROOT:-$ROOT/.broker43/root}
EPMD_PORT=4373
log() { printf 'cluster43: %s\n' "$*" >&2; }
die() { printf 'cluster43: error: %s\n' "$*" >&2; exit 1; }

node_name() { echo "amqpjobs43-c$1@localhost"; }

in_node() {  # N CMD: run CMD in the chroot with node N's environment
  local n=$1
  chroot "$CH" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
    RABBITMQ_NODENAME="$(node_name "$n")" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$((5730 + n)) \
    RABBITMQ_DIST_PORT=$((25730 + n)) RABBITMQ_MNESIA_BASE=/var/lib/rabbitmq/cluster43/n$n \
    RABBITMQ_LOG_BASE=/var/log/rabbitmq/cluster43/n$n RABBITMQ_CONFIG_FILE=/etc/rabbitmq/cluster43/n$n.conf \
    RABBITMQ_CONF_ENV_FILE=/etc/rabbitmq/cluster43/env.conf ERL_CRASH_DUMP=/var/log/rabbitmq/cluster43/n$n/erl_crash.dump \
    ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" bash -c "$2"
}
ctl() { local n=$1; shift; in_node "$n" "rabbitmqctl -n $(node_name "$n") $(printf '%q ' "$@")"; }

answers() { curl -fsS --max-time 5 -u guest:guest "http://127.0.0.1:$((15730 + $1))/api/overview" >/dev/null 2>&1; }

prepare() {
  [ "$(id -u)" = 0 ] || die "needs root (chroot)"
  if [ ! -x "$CH/usr/sbin/rabbitmq-server" ]; then
    [ -z "${AMQPJOBS_CLUSTER43_CHROOT:-}" ] || die "$CH has no rabbitmq-server: build it with scripts/broker43.sh build"
    bash "$ROOT/scripts/broker43.sh" build
  fi
  mountpoint -q "$CH/proc" || mount -t proc proc "$CH/proc"
  mkdir -p "$CH/etc/rabbitmq/cluster43"
  cat >"$CH/etc/rabbitmq/cluster43/env.conf" <<ENV
ERL_EPMD_PORT=$EPMD_PORT
ERL_EPMD_ADDRESS=127.0.0.1
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
ENV
  for n in 1 2 3; do
    cat >"$CH/etc/rabbitmq/cluster43/n$n.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$((5730 + n))
management.tcp.ip = 127.0.0.1
management.tcp.port = $((15730 + n))
CONF
    mkdir -p "$CH/var/lib/rabbitmq/cluster43/n$n" "$CH/var/log/rabbitmq/cluster43/n$n"
  done
  in_node 1 "chown -R rabbitmq:rabbitmq /var/lib/rabbitmq/cluster43 /var/log/rabbitmq/cluster43"
}

up_node() {  # N: start node N's VM, or its app when `stop N` left the VM running
  local n=$1
  if ctl "$n" -q ping >/dev/null 2>&1; then
    ctl "$n" -q start_app >/dev/null 2>&1 || true
  else
    log "starting $(node_name "$n") on 127.0.0.1:$((5730 + n)) (management $((15730 + n))) ..."
    in_node "$n" "nohup rabbitmq-server >/var/log/rabbitmq/cluster43/n$n/console.log 2>&1 &"
  fi
}

wait_node() {
  local n=$1
  for _ in $(seq 1 60); do
    ctl "$n" -q await_startup --timeout 5 >/dev/null 2>&1 && answers "$n" && return 0
    sleep 2
  done
  tail -30 "$CH/var/log/rabbitmq/cluster43/n$n/console.log" >&2 || true
  die "node $(node_name "$n") did not come up"
}

case "${1:-}" in
  up)
    prepare
    for n in 1 2 3; do up_node "$n"; done
    for n in 1 2 3; do wait_node "$n"; done
    for n in 2 3; do
      # Read whole before grep (no pipe): under pipefail, grep -q exiting at the first match could fail the pipe.
      status=$(ctl "$n" -q cluster_status 2>/dev/null || true)
      if ! grep -qF "$(node_name 1)" <<<"$status"; then
        log "joining $(node_name "$n") to $(node_name 1) ..."
        {
          ctl "$n" -q stop_app
          ctl "$n" -q reset
          ctl "$n" -q join_cluster "$(node_name 1)"
          ctl "$n" -q start_app
        } >>"$CH/var/log/rabbitmq/cluster43/join.log" 2>&1 || { tail -20 "$CH/var/log/rabbitmq/cluster43/join.log" >&2; exit 1; }
      fi
    done
    ctl 1 -q await_online_nodes 3 >&2
    log "3 nodes running: amqp ports 5731-5733, management 15731-15733" ;;
  down)
    [ -x "$CH/usr/sbin/rabbitmqctl" ] || exit 0
    mountpoint -q "$CH/proc" || mount -t proc proc "$CH/proc"
    for n in 3 2 1; do ctl "$n" -q stop >/dev/null 2>&1 || true; done
    in_node 1 "epmd -port $EPMD_PORT -kill >/dev/null 2>&1" || true
    # /proc stays mounted while a node still runs in the chroot (the single 4.3 node of broker43.sh);
    # an epmd left behind needs no /proc
    in_chroot=""
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/root" 2>/dev/null)" = "$(readlink -f "$CH")" ] && [ "$(cat "$p/comm" 2>/dev/null)" != epmd ] \
        && in_chroot=1 && break
    done
    if [ -z "$in_chroot" ]; then umount "$CH/proc" || umount -l "$CH/proc"; fi ;;
  url)
    n=${2:?node number}
    echo "amqp://guest:guest@127.0.0.1:$((5730 + n))/"
    echo "http://127.0.0.1:$((15730 + n))/" ;;
  stop) ctl "${2:?node number}" -q stop_app >/dev/null ;;
  start) ctl "${2:?node number}" -q start_app >/dev/null ;;
  ctl) n=${2:?node number}; shift 2; ctl "$n" "$@" ;;
  *) echo "usage: $0 up|down|url N|stop N|start N|ctl N ARGS..." >&2; exit 2 ;;
esac
