#!/usr/bin/env bash
# One RabbitMQ (with the management plugin) for developers, tests, the demo and CI.
#
#   scripts/broker.sh up          start it (idempotent), then print the AMQP and management URLs (password masked)
#   scripts/broker.sh down        stop it (harmless when nothing runs)
#   scripts/broker.sh status      "up (local node amqpjobs@localhost, RabbitMQ X.Y.Z)" (exit 0) or "down" (exit 3)
#   scripts/broker.sh url         two lines: AMQP URL (with credentials), management URL
#   scripts/broker.sh ctl ARGS... rabbitmqctl ARGS... against the project broker
#
# Mode: Docker when `docker info` works (compose.yaml, ports 5672/15672), otherwise a local
# node of the distribution's rabbitmq-server: node amqpjobs@localhost, everything under
# <repo>/.broker/, listeners on 127.0.0.1 only. Local ports come from the environment at `up`:
#   AMQPJOBS_BROKER_PORT (5682), AMQPJOBS_BROKER_MGMT_PORT (15682), AMQPJOBS_BROKER_DIST_PORT (25682)
#   AMQPJOBS_BROKER_NODE (amqpjobs@localhost; change it to run a second checkout's node beside this one)
# and are recorded in .broker/ports for the other commands. When a RabbitMQ node already answers
# on those ports with guest/guest (another checkout's), `up` uses it and says so in one line;
# `down` then leaves it running (this checkout did not start it) and `ctl` refuses. AMQPJOBS_BROKER_EXTRA_CONF names a
# file of rabbitmq.conf lines appended to the node's config at `up` (TLS listeners, say).
# Progress goes to stderr; stdout carries only URLs / status.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=other-node.sh
. "$ROOT/scripts/other-node.sh"
B=${AMQPJOBS_BROKER_DIR:-$ROOT/.broker}   # data, logs, config of this node
LETTERS=ABCDEFGHIJKLMNOPQRSTUVWXYZ
COMPOSE_FILE=$ROOT/compose.yaml
NODE=${AMQPJOBS_BROKER_NODE:-amqpjobs@localhost}
RMQ_BIN=/usr/lib/rabbitmq/bin          # the real scripts, not the /usr/sbin wrappers that su to rabbitmq
START_TIMEOUT=${AMQPJOBS_BROKER_START_TIMEOUT:-90}

log() { printf 'broker: %s\n' "$*" >&2; }
die() { printf 'broker: error: %s\n' "$*" >&2; exit 1; }

docker_usable() { command -v docker >/dev/null 2>&1 && timeout 5 docker info >/dev/null 2>&1; }
compose() { docker compose -f "$COMPOSE_FILE" "$@"; }

current_mode() {
  if [ -f "$B/mode" ]; then cat "$B/mode"
  elif docker_usable; then echo docker
  else echo local; fi
}

lock() {
  mkdir -p "$B"
  exec 9>"$B/lock"
  flock -w 180 9 || die "another broker.sh up/down holds $B/lock"
}

# ---------------------------------------------------------------- local node
load_ports() {
  PORT=${AMQPJOBS_BROKER_PORT:-5682}
  MGMT_PORT=${AMQPJOBS_BROKER_MGMT_PORT:-15682}
  DIST_PORT=${AMQPJOBS_BROKER_DIST_PORT:-25682}
  NODE=${AMQPJOBS_BROKER_NODE:-amqpjobs@localhost}
  if [ "${1:-}" != fresh ] && [ -f "$B/ports" ]; then
    # shellcheck disable=SC1091
    . "$B/ports"
  fi
  [[ $NODE == *@* ]] || NODE=$NODE@localhost
}

# The environment of the node and of every CLI call that talks to it.
node_env() {
  local v
  for v in $(compgen -e | grep '^RABBITMQ_' || true); do unset "$v"; done
  export HOME=$B/home                       # Erlang cookie lives here (node and CLI alike)
  export RABBITMQ_NODENAME=$NODE
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$PORT
  export RABBITMQ_DIST_PORT=$DIST_PORT
  export RABBITMQ_MNESIA_BASE=$B/mnesia
  export RABBITMQ_LOG_BASE=$B/log
  export RABBITMQ_CONFIG_FILE=$B/rabbitmq.conf
  export RABBITMQ_ADVANCED_CONFIG_FILE=$B/advanced.config   # absent on purpose
  export RABBITMQ_CONF_ENV_FILE=$B/rabbitmq-env.conf        # empty: ignore /etc/rabbitmq/rabbitmq-env.conf
  export RABBITMQ_ENABLED_PLUGINS_FILE=$B/enabled_plugins
  export RABBITMQ_PID_FILE=$B/rabbitmq.pid
  # Erlang distribution (node and CLI) and epmd on loopback only.
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export ERL_EPMD_ADDRESS=127.0.0.1
}

# rmqctl / rmqdiag SECONDS ARGS...: the CLI against our node, bounded in time.
rmqctl() { local t=$1; shift; ( node_env; exec timeout "$t" "$RMQ_BIN/rabbitmqctl" -n "$NODE" "$@" ); }
rmqdiag() { local t=$1; shift; ( node_env; exec timeout "$t" "$RMQ_BIN/rabbitmq-diagnostics" -n "$NODE" "$@" ); }

pid_running() {   # $1 pid: exists and is not a zombie
  local st
  [[ ${1:-} =~ ^[0-9]+$ ]] && st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) && [ "${st%% *}" != Z ]
}
pid_is_ours() {   # $1 pid: running and started with this checkout's .broker
  # Read whole before grep (no pipe): under pipefail, `tr | grep -q` failed whenever grep exited before tr's
  # last write (SIGPIPE), and a node with a long environment was now and then taken for dead.
  local env
  pid_running "${1:-}" && env=$(tr '\0' '\n' 2>/dev/null <"/proc/$1/environ") &&
    grep -qxF "RABBITMQ_MNESIA_BASE=$B/mnesia" <<<"$env"
}
node_pid() { cat "$B/rabbitmq.pid" 2>/dev/null || true; }
launcher_pid() { cat "$B/launcher.pid" 2>/dev/null || true; }
node_alive() { pid_is_ours "$(node_pid)" || pid_is_ours "$(launcher_pid)"; }

overview() {
  curl -fsS --max-time 5 -u guest:guest "http://127.0.0.1:$MGMT_PORT/api/overview" 2>/dev/null
}
# (Output is captured before grep -q: with pipefail, an early grep exit could fail the pipe.)
mgmt_ready() { local ov; ov=$(overview) && grep -qF "\"node\":\"$NODE\"" <<<"$ov"; }

port_busy() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

reused() { [ -f "$B/reused" ]; }   # `up` found another's node running and uses it (never stops it)

as_root_install() {   # $1 package
  [ "$(id -u)" = 0 ] || die "$1 is not installed; install it: sudo apt-get install -y $1"
  log "installing $1 with apt-get ..."
  apt-get -o DPkg::Lock::Timeout=600 update >&2 && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y "$1" >&2
}

ensure_packages() {
  if [ ! -x "$RMQ_BIN/rabbitmq-server" ]; then
    as_root_install rabbitmq-server
    [ -x "$RMQ_BIN/rabbitmq-server" ] || die "rabbitmq-server installed but $RMQ_BIN/rabbitmq-server is missing"
  fi
  command -v curl >/dev/null 2>&1 || as_root_install curl
  command -v flock >/dev/null 2>&1 || die "flock (util-linux) is missing"
}

write_files() {
  mkdir -p "$B/home" "$B/mnesia" "$B/log"
  chmod 700 "$B/home"
  if [ ! -s "$B/home/.erlang.cookie" ]; then
    local b cookie=
    for b in $(od -An -N20 -tu1 /dev/urandom); do cookie+=${LETTERS:$((b % 26)):1}; done
    (umask 077; printf '%s' "$cookie" >"$B/home/.erlang.cookie")
    chmod 400 "$B/home/.erlang.cookie"
  fi
  : >"$B/rabbitmq-env.conf"
  if [ -f "$ROOT/scripts/rabbitmq.conf.tmpl" ]; then
    sed -e "s/@PORT@/$PORT/g" -e "s/@MGMT_PORT@/$MGMT_PORT/g" \
      "$ROOT/scripts/rabbitmq.conf.tmpl" >"$B/rabbitmq.conf"
  else
    cat >"$B/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $MGMT_PORT
CONF
  fi
  if [ -n "${AMQPJOBS_BROKER_EXTRA_CONF:-}" ]; then   # e.g. TLS listeners (tests/integration/test_tls.py)
    cat "$AMQPJOBS_BROKER_EXTRA_CONF" >>"$B/rabbitmq.conf"
  fi
  echo '[rabbitmq_management,rabbitmq_consistent_hash_exchange].' >"$B/enabled_plugins"
  printf 'PORT=%s\nMGMT_PORT=%s\nDIST_PORT=%s\nNODE=%s\n' "$PORT" "$MGMT_PORT" "$DIST_PORT" "$NODE" >"$B/ports"
}

log_size() { stat -c %s "$1" 2>/dev/null || echo 0; }

fail_start() {
  log "$1"
  local f off new
  for f in "$B/log/$NODE.log" "$B/log/console.log"; do
    off=$(grep -F "$f=" "$B/log.offsets" 2>/dev/null | cut -d= -f2 || true)
    new=$(tail -c +"$(( ${off:-0} + 1 ))" "$f" 2>/dev/null || true)
    [ -n "$new" ] || continue
    if grep -q '\[error\]' <<<"$new"; then
      printf '\n----- first errors in %s -----\n' "$f" >&2
      grep -m 8 '\[error\]' <<<"$new" >&2 || true
    fi
    printf '\n----- last lines of %s -----\n' "$f" >&2
    tail -n 25 <<<"$new" >&2
  done
  if [ "${STARTED_HERE:-0}" = 1 ] && node_alive; then
    log "stopping the node that did not come up"
    local_down
  fi
  exit 1
}

# Wait until the node has booted and the management API answers; $1 = deadline (epoch s).
wait_ready() {
  local deadline=$1
  while ! rmqctl 20 -q await_startup --timeout 5 >/dev/null 2>&1; do
    node_alive || fail_start "node $NODE exited during startup"
    [ "$(date +%s)" -lt "$deadline" ] || fail_start "node $NODE did not finish booting within ${START_TIMEOUT}s"
    sleep 1
  done
  until mgmt_ready; do
    node_alive || fail_start "node $NODE exited during startup"
    [ "$(date +%s)" -lt "$deadline" ] ||
      fail_start "management API http://127.0.0.1:$MGMT_PORT/ did not answer within ${START_TIMEOUT}s"
    sleep 0.5
  done
}

epmd_running() { epmd -names >/dev/null 2>&1; }
epmd_names() { epmd -names 2>/dev/null || true; }

local_up() {
  local t0 deadline
  t0=$(date +%s)
  if node_alive; then
    load_ports
    if ! mgmt_ready; then
      if [ "$(rmqdiag 20 -q is_booting 2>/dev/null || true)" = true ]; then
        log "node $NODE is booting; waiting ..."
      else
        log "node $NODE is running but RabbitMQ is not answering; running start_app ..."
        rmqctl 60 -q start_app >&2 || true
      fi
      wait_ready $((t0 + START_TIMEOUT))
    fi
    log "already running: local node $NODE (pid $(node_pid))"
    echo local >"$B/mode"
    return 0
  fi

  load_ports fresh
  local p found
  if found=$(other_node "$PORT" "$MGMT_PORT"); then   # another checkout's node on our ports: use it rather than fail
    NODE=${found%% *}
    mkdir -p "$B"
    printf 'PORT=%s\nMGMT_PORT=%s\nDIST_PORT=%s\nNODE=%s\n' "$PORT" "$MGMT_PORT" "$DIST_PORT" "$NODE" >"$B/ports"
    echo "$NODE" >"$B/reused"
    echo local >"$B/mode"
    using_other_node broker "$PORT" "$found" "make broker-down"
    return 0
  fi
  rm -f "$B/reused"
  ensure_packages
  if grep -q "^name ${NODE%@*} at port " <<<"$(epmd_names)"; then
    die "Erlang node name $NODE is already taken by another node on this machine (another checkout's broker?); stop it, or set AMQPJOBS_BROKER_NODE to another name (and other ports)"
  fi
  for p in "$PORT" "$MGMT_PORT" "$DIST_PORT"; do
    port_busy "$p" && die "port 127.0.0.1:$p is already in use by another process, not a RabbitMQ node answering with guest/guest on 127.0.0.1:$MGMT_PORT with AMQP on $PORT (which would be used); stop it, or set AMQPJOBS_BROKER_PORT / _MGMT_PORT / _DIST_PORT"
  done
  write_files
  rm -f "$B/rabbitmq.pid" "$B/launcher.pid" "$B/epmd.pid"

  # Start epmd ourselves (loopback only) unless one already runs, so `down` knows it is ours.
  if ! epmd_running; then
    command -v epmd >/dev/null 2>&1 || die "epmd (erlang-base) not found"
    setsid epmd -address 127.0.0.1 </dev/null >>"$B/log/epmd.log" 2>&1 9>&- &
    echo $! >"$B/epmd.pid"
    for _ in $(seq 1 50); do epmd_running && break; sleep 0.1; done
  fi

  # Remember where the logs end now, so a failure shows only this start's lines.
  printf '%s=%s\n' "$B/log/$NODE.log" "$(log_size "$B/log/$NODE.log")" \
    "$B/log/console.log" "$(log_size "$B/log/console.log")" >"$B/log.offsets"
  STARTED_HERE=1
  log "starting local node $NODE (AMQP 127.0.0.1:$PORT, management 127.0.0.1:$MGMT_PORT, dist $DIST_PORT) ..."
  (
    node_env
    cd "$B"
    exec setsid "$RMQ_BIN/rabbitmq-server" </dev/null >>"$B/log/console.log" 2>&1
  ) 9>&- &   # fd 9 is our lock: the node must not inherit it
  echo $! >"$B/launcher.pid"
  echo local >"$B/mode"

  deadline=$((t0 + START_TIMEOUT))
  wait_ready "$deadline"
  log "local node $NODE is up (pid $(node_pid)) after $(( $(date +%s) - t0 ))s; logs in $B/log"
}

stop_our_epmd() {
  local pid
  pid=$(cat "$B/epmd.pid" 2>/dev/null || true)
  rm -f "$B/epmd.pid"
  pid_running "$pid" || return 0
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = epmd ] || return 0
  # Leave it for others when any other node still relies on it.
  if grep -q '^name ' <<<"$(epmd_names)"; then
    log "leaving epmd (pid $pid) running: other Erlang nodes are registered with it"
    return 0
  fi
  kill "$pid" 2>/dev/null || true
}

wait_gone() {   # $1 pid, $2 tenths of a second
  local i
  for ((i = 0; i < $2; i++)); do
    pid_running "$1" || return 0
    sleep 0.1
  done
  ! pid_running "$1"
}

local_down() {
  load_ports
  local npid lpid p
  if reused; then
    log "leaving node $NODE running: this checkout did not start it (it was already answering on 127.0.0.1:$PORT)"
    rm -f "$B/reused" "$B/mode"
    return 0
  fi
  npid=$(node_pid); lpid=$(launcher_pid)
  if node_alive; then
    log "stopping local node $NODE ..."
    # With the pid file, `stop` returns only once the OS process has exited.
    if pid_is_ours "$npid"; then
      rmqctl 60 -q stop "$B/rabbitmq.pid" >/dev/null 2>&1 || true
    else
      rmqctl 30 -q stop >/dev/null 2>&1 || true
    fi
    for p in $npid $lpid; do
      pid_is_ours "$p" || continue
      wait_gone "$p" 150 && continue
      log "pid $p still alive; sending TERM"
      kill -TERM "$p" 2>/dev/null || true
      wait_gone "$p" 100 && continue
      log "pid $p still alive; sending KILL"
      kill -KILL "$p" 2>/dev/null || true
    done
    log "stopped"
  else
    log "local node $NODE is not running"
  fi
  stop_our_epmd
  rm -f "$B/rabbitmq.pid" "$B/launcher.pid" "$B/mode"
}

local_status() {
  load_ports
  local ov ver found
  if reused; then
    if found=$(other_node "$PORT" "$MGMT_PORT") && [ "${found%% *}" = "$NODE" ]; then
      echo "up (RabbitMQ node $NODE on 127.0.0.1:$PORT, not started by this checkout, RabbitMQ ${found#* })"
      return 0
    fi
    echo down
    return 3
  fi
  if node_alive && ov=$(overview) && grep -qF "\"node\":\"$NODE\"" <<<"$ov"; then
    ver=$(grep -o '"rabbitmq_version":"[^"]*"' <<<"$ov" | head -1 | cut -d'"' -f4)
    echo "up (local node $NODE, RabbitMQ ${ver:-unknown})"
    return 0
  fi
  node_alive && log "node $NODE (pid $(node_pid)) runs, but RabbitMQ / the management API does not answer"
  echo down
  return 3
}

local_url() {
  load_ports
  echo "amqp://guest:guest@127.0.0.1:$PORT/"
  echo "http://127.0.0.1:$MGMT_PORT/"
}

# ---------------------------------------------------------------- docker
docker_up() {
  log "docker is usable: docker compose up rabbitmq ($COMPOSE_FILE) ..."
  echo docker >"$B/mode"
  compose up -d --wait rabbitmq >&2
}
docker_down() {
  compose down >&2 || true
  rm -f "$B/mode"
}
docker_status() {
  local ov ver
  if [ -n "$(compose ps -q --status running rabbitmq 2>/dev/null)" ] &&
    ov=$(curl -fsS --max-time 5 -u guest:guest http://127.0.0.1:15672/api/overview 2>/dev/null); then
    ver=$(grep -o '"rabbitmq_version":"[^"]*"' <<<"$ov" | head -1 | cut -d'"' -f4)
    echo "up (docker compose service rabbitmq, RabbitMQ ${ver:-unknown})"
    return 0
  fi
  echo down
  return 3
}
# `ctl import_definitions HOST_FILE`: the file is copied into the container first.
docker_ctl() {
  if [ "${1:-}" = import_definitions ] && [ -f "${2:-}" ]; then
    compose cp "$2" rabbitmq:/tmp/amqpjobs-definitions.json >&2
    set -- import_definitions /tmp/amqpjobs-definitions.json "${@:3}"
  fi
  exec docker compose -f "$COMPOSE_FILE" exec -T rabbitmq rabbitmqctl "$@"
}
docker_url() {
  echo "amqp://guest:guest@127.0.0.1:5672/"
  echo "http://127.0.0.1:15672/"
}

# ---------------------------------------------------------------- main
mask() { sed -E 's#://([^:/@]*):[^@]*@#://\1:***@#'; }
usage() { echo "usage: $0 up|down|status|url|ctl ARGS..." >&2; exit 2; }
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up)
    lock
    mode=$(cat "$B/mode" 2>/dev/null || true)
    # `up` shows the URLs with the password masked; `url` prints them whole, for programs.
    if [ "$mode" = local ] && node_alive; then local_up; local_url | mask
    elif [ "$mode" = docker ] || { [ "$mode" != local ] && docker_usable; }; then docker_up; docker_url | mask
    else local_up; local_url | mask
    fi ;;
  down)
    lock
    if [ "$(current_mode)" = docker ]; then docker_down; else local_down; fi ;;
  status)
    if [ "$(current_mode)" = docker ]; then docker_status; else local_status; fi ;;
  url)
    if [ "$(current_mode)" = docker ]; then docker_url; else local_url; fi ;;
  ctl)
    if [ "$(current_mode)" = docker ]; then docker_ctl "$@"
    else
      load_ports
      reused && die "node $NODE was not started by this checkout (scripts/broker.sh up found it running on 127.0.0.1:$PORT); run rabbitmqctl where it was started (its checkout's scripts/broker.sh ctl), or use its management UI http://127.0.0.1:$MGMT_PORT/"
      node_env; exec "$RMQ_BIN/rabbitmqctl" -n "$NODE" "$@"
    fi ;;
  *) usage ;;
esac
