#!/usr/bin/env bash
# A 3-node RabbitMQ 3.10 cluster on loopback, for chaos tests (node loss with quorum queues).
#
#   scripts/cluster.sh up          start nodes amqpjobs-c1..c3 (own names, ports, data under .cluster/), join them
#   scripts/cluster.sh down        stop the three nodes
#   scripts/cluster.sh url N       AMQP URL and management URL of node N (1..3)
#   scripts/cluster.sh stop N      stop node N (stop_app: the Erlang VM stays, `start N` brings it back)
#   scripts/cluster.sh start N     start node N again
#
# Ports of node N: AMQP 5700+N, management 15700+N, distribution 25700+N. Each node is a
# scripts/broker.sh node (AMQPJOBS_BROKER_DIR/_NODE/_PORT...), sharing one Erlang cookie.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
C=$ROOT/.cluster
log() { printf 'cluster: %s\n' "$*" >&2; }

node_env() {  # N: the broker.sh environment of node N
  export AMQPJOBS_BROKER_DIR=$C/n$1 AMQPJOBS_BROKER_NODE=amqpjobs-c$1@localhost
  export AMQPJOBS_BROKER_PORT=$((5700 + $1)) AMQPJOBS_BROKER_MGMT_PORT=$((15700 + $1)) AMQPJOBS_BROKER_DIST_PORT=$((25700 + $1))
}
broker() { local n=$1; shift; ( node_env "$n"; bash "$ROOT/scripts/broker.sh" "$@" ); }

members() { broker 1 ctl -q cluster_status --formatter json 2>/dev/null | tr -d ' \n' | grep -o '"running_nodes":\[[^]]*\]' || true; }

up_once() {  # start the 3 nodes and join 2 and 3 to 1; fails unless c1 then sees all 3 running
  mkdir -p "$C"
  if [ ! -s "$C/cookie" ]; then
    od -An -N20 -tu1 /dev/urandom | tr -s ' ' '\n' | awk 'NF { printf "%c", 65 + $1 % 26 }' >"$C/cookie"
  fi
  local n pids=() failed=0
  for n in 1 2 3; do
    mkdir -p "$C/n$n/home"
    chmod 700 "$C/n$n/home"
    if ! cmp -s "$C/cookie" "$C/n$n/home/.erlang.cookie" 2>/dev/null; then
      install -m 400 "$C/cookie" "$C/n$n/home/.erlang.cookie"
    fi
    echo local >"$C/n$n/mode"
  done
  # The three boots at once (each waits mostly on its own node): 1 min less than one after another under CI load.
  # Node 1 first gets epmd going when none runs, so the other two never race to start one.
  epmd -names >/dev/null 2>&1 || { broker 1 up >/dev/null || return 1; }
  for n in 1 2 3; do broker "$n" up >/dev/null & pids+=($!); done
  for n in "${pids[@]}"; do wait "$n" || failed=1; done
  [ "$failed" = 0 ] || return 1
  for n in 2 3; do
    if ! members | grep -q "amqpjobs-c$n@localhost"; then
      log "joining amqpjobs-c$n to amqpjobs-c1 ..."
      # (no `reset` first: join_cluster resets the node itself, rabbitmqctl(8))
      { broker "$n" ctl -q stop_app &&
        broker "$n" ctl -q join_cluster amqpjobs-c1@localhost && broker "$n" ctl -q start_app; } >>"$C/join.log" 2>&1 || return 1
    fi
  done
  timeout 180 bash -c "until [ \"\$(\"\$0\" members_count)\" = 3 ]; do sleep 1; done" "${BASH_SOURCE[0]}" || return 1
}

case "${1:-}" in
  up)
    # A node that fails to join (a loaded machine can time a join out half-way: the node then
    # says it is a member while c1 does not list it) is rebuilt from scratch, once: the
    # cluster's data is throwaway test data.
    up_once || { log "the cluster did not form (see $C/join.log); rebuilding its nodes from scratch ..."
                 for n in 3 2 1; do broker "$n" down >/dev/null 2>&1 || true; rm -rf "$C/n$n"; done
                 up_once || { tail -20 "$C/join.log" >&2; exit 1; }; }
    log "3 nodes running: amqp ports 5701-5703, management 15701-15703" ;;
  down)
    for n in 3 2 1; do [ -d "$C/n$n" ] && broker "$n" down || true; done ;;
  members_count) members | grep -o 'amqpjobs-c[0-9]@localhost' | sort -u | wc -l ;;
  url) broker "${2:?node number}" url ;;
  stop) broker "${2:?node number}" ctl -q stop_app >>"$C/ops.log" 2>&1 ;;
  start) { broker "${2:?node number}" ctl -q start_app; broker "$2" ctl -q await_startup; } >>"$C/ops.log" 2>&1 ;;
  *) echo "usage: $0 up|down|url N|stop N|start N" >&2; exit 2 ;;
esac
