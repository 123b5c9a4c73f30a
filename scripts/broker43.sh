#!/usr/bin/env bash
# A RabbitMQ 4.3.x node without Docker: Debian unstable (sid)'s rabbitmq-server, pinned to
# 4.3.x, in a chroot under <repo>/.broker43/ (node amqpjobs43@localhost, 127.0.0.1:5712,
# management 15712, distribution 25712, its own epmd on 4371). Same commands as
# scripts/broker4.sh, which holds the logic: up | down | status | url | ctl ARGS...
# Ports: AMQPJOBS_BROKER43_PORT, AMQPJOBS_BROKER43_MGMT_PORT, AMQPJOBS_BROKER43_DIST_PORT.
AMQPJOBS_BROKER4_VARIANT=43 exec bash "$(dirname "${BASH_SOURCE[0]}")/broker4.sh" "$@"
