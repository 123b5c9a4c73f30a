# Sourced by scripts/broker.sh and scripts/broker4.sh (no shebang: not run by itself).
#
# other_node PORT MGMT_PORT: when a RabbitMQ node answers on 127.0.0.1:MGMT_PORT with guest/guest
# and has its AMQP listener on PORT (another checkout's node on the same ports), print
# "NODE VERSION" and succeed; otherwise fail. The scripts then use that node rather than fail or
# start a second one, and never stop it (this checkout did not start it).
other_node() {
  local ov node ver
  ov=$(curl -fsS --max-time 5 -u guest:guest "http://127.0.0.1:$2/api/overview" 2>/dev/null) || return 1
  grep -qE "\"protocol\":\"amqp\",\"ip_address\":\"[^\"]*\",\"port\":$1[,}]" <<<"$ov" || return 1
  node=$(grep -o '"node":"[^"]*"' <<<"$ov" | head -1 | cut -d'"' -f4)
  ver=$(grep -o '"rabbitmq_version":"[^"]*"' <<<"$ov" | head -1 | cut -d'"' -f4)
  [ -n "$node" ] || return 1
  echo "$node ${ver:-unknown}"
}

# The one line `up` says when it uses such a node; $1 script name, $2 PORT, $3 "NODE VERSION", $4 the down command.
using_other_node() {
  printf '%s: using the RabbitMQ node already running on 127.0.0.1:%s (%s, RabbitMQ %s); this checkout did not start it, so `%s` leaves it alone\n' \
    "$1" "$2" "${3%% *}" "${3#* }" "$4" >&2
}
