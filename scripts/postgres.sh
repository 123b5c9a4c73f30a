#!/usr/bin/env bash
# A PostgreSQL server for the idempotency-ledger tests, from Debian's package.
#
#   scripts/postgres.sh up      install postgresql when missing (root), create/start cluster "amqpjobs"; print its URL
#   scripts/postgres.sh down    stop that cluster
#   scripts/postgres.sh url     print the URL (postgresql://amqpjobs:amqpjobs@127.0.0.1:PORT/amqpjobs)
#
# Port: AMQPJOBS_PG_PORT (5442). Listens on 127.0.0.1 only. The cluster lives where Debian's
# pg_createcluster puts it (/var/lib/postgresql/<version>/amqpjobs); only that cluster is touched.
set -euo pipefail
PORT=${AMQPJOBS_PG_PORT:-5442}
CLUSTER=amqpjobs
URL="postgresql://amqpjobs:amqpjobs@127.0.0.1:$PORT/amqpjobs"
log() { printf 'postgres: %s\n' "$*" >&2; }

version() { ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1; }

ensure_installed() {
  if [ -z "$(version)" ] || ! command -v pg_createcluster >/dev/null; then
    [ "$(id -u)" = 0 ] || { log "postgresql is not installed: sudo apt-get install -y postgresql"; exit 1; }
    log "installing postgresql with apt-get ..."
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq postgresql >&2
  fi
}

case "${1:-}" in
  up)
    ensure_installed
    V=$(version)
    if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$V $CLUSTER"; then
      log "creating cluster $V/$CLUSTER on 127.0.0.1:$PORT ..."
      pg_createcluster "$V" "$CLUSTER" --port "$PORT" -- --auth-local=peer --auth-host=scram-sha-256 >&2
      echo "listen_addresses = '127.0.0.1'" >>"/etc/postgresql/$V/$CLUSTER/postgresql.conf"
    fi
    if ! pg_lsclusters -h | awk -v v="$V" -v c="$CLUSTER" '$1==v && $2==c {print $4}' | grep -qx online; then
      pg_ctlcluster "$V" "$CLUSTER" start >&2
    fi
    for _ in $(seq 1 30); do
      su postgres -c "psql -p $PORT -qtAc 'select 1'" >/dev/null 2>&1 && break
      sleep 1
    done
    su postgres -c "psql -p $PORT -qtAc \"select 1 from pg_roles where rolname='amqpjobs'\"" | grep -q 1 ||
      su postgres -c "psql -p $PORT -qc \"create role amqpjobs login password 'amqpjobs' createdb\"" >&2
    su postgres -c "psql -p $PORT -qtAc \"select 1 from pg_database where datname='amqpjobs'\"" | grep -q 1 ||
      su postgres -c "createdb -p $PORT -O amqpjobs amqpjobs" >&2
    echo "$URL" ;;
  down)
    V=$(version)
    if [ -n "$V" ] && pg_lsclusters -h 2>/dev/null | awk '{print $1" "$2}' | grep -qx "$V $CLUSTER"; then
      pg_ctlcluster "$V" "$CLUSTER" stop >&2 || true
    fi ;;
  url) echo "$URL" ;;
  *) echo "usage: $0 up|down|url" >&2; exit 2 ;;
esac
