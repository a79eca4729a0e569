#!/usr/bin/env bash
# A throwaway RabbitMQ for the comparative benchmarks, from Debian's rabbitmq-server package,
# listening on 127.0.0.1 only (AMQP on 5672, Erlang distribution and epmd on loopback too),
# with its data and logs in a temporary directory that `stop` removes.
#
#   ./rabbitmq.sh install   # apt-get install -y rabbitmq-server (as root); the Debian service is disabled
#   ./rabbitmq.sh start     # start the node and wait until it is up (rabbitmqctl await_startup)
#   ./rabbitmq.sh status    # is it up?
#   ./rabbitmq.sh stop      # stop the node, its epmd, and remove the temporary directory
#
# The benchmark connects to amqp://guest:guest@127.0.0.1:5672/ (guest may log in from loopback).
set -euo pipefail

NODE="warrenbench@localhost"
BASE="${WARREN_BENCH_RABBITMQ_DIR:-${TMPDIR:-/tmp}/warren-bench-rabbitmq}"

# Everything the node reads from its environment; the same for start, status and stop.
setenv() {
	export RABBITMQ_NODENAME="$NODE"
	export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
	export RABBITMQ_NODE_PORT=5672
	export RABBITMQ_DIST_PORT=25672
	export ERL_EPMD_ADDRESS=127.0.0.1 # epmd listens on loopback only
	export RABBITMQ_MNESIA_BASE="$BASE/mnesia"
	export RABBITMQ_LOG_BASE="$BASE/log"
	export RABBITMQ_PID_FILE="$BASE/rabbitmq.pid"
	export RABBITMQ_ENABLED_PLUGINS_FILE="$BASE/enabled_plugins" # no plugins: no management listener
	export RABBITMQ_CONFIG_FILE="$BASE/rabbitmq"                 # rabbitmq.conf
	export RABBITMQ_ADVANCED_CONFIG_FILE="$BASE/advanced.config"
	# The inter-node (distribution) listener binds to loopback as well.
	export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
	export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

need_root() {
	if [ "$(id -u)" != 0 ]; then
		echo "rabbitmq.sh: $1 needs root" >&2
		exit 1
	fi
}

installed() { command -v rabbitmq-server >/dev/null 2>&1 || [ -x /usr/sbin/rabbitmq-server ]; }

cmd_install() {
	need_root install
	if ! command -v apt-get >/dev/null 2>&1; then
		echo "rabbitmq.sh: apt-get is not available here; install RabbitMQ another way (the benchmark skips rabbitmq without it)" >&2
		exit 1
	fi
	if installed; then
		echo "rabbitmq-server is already installed"
	else
		# Keep the package's maintainer scripts from starting the service (policy-rc.d 101 =
		# action forbidden); this script starts its own node on loopback instead.
		local policy=/usr/sbin/policy-rc.d created_policy=0
		if [ ! -e "$policy" ]; then
			printf '#!/bin/sh\nexit 101\n' >"$policy"
			chmod +x "$policy"
			created_policy=1
		fi
		apt-get update
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rabbitmq-server || {
			[ "$created_policy" = 1 ] && rm -f "$policy"
			exit 1
		}
		[ "$created_policy" = 1 ] && rm -f "$policy"
	fi
	# Should the Debian service have started (or start at boot), stop and disable it.
	if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
		systemctl stop rabbitmq-server 2>/dev/null || true
		systemctl disable rabbitmq-server 2>/dev/null || true
	else
		if [ -x /etc/init.d/rabbitmq-server ]; then
			/etc/init.d/rabbitmq-server stop >/dev/null 2>&1 || true
		fi
		update-rc.d rabbitmq-server disable >/dev/null 2>&1 || true
	fi
	# The package's scripts leave an epmd listening on every interface: end it (it exits only if
	# no node is registered with it); `start` runs one on loopback.
	if command -v epmd >/dev/null 2>&1; then
		epmd -kill >/dev/null 2>&1 || true
	fi
	echo "rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null) installed; the Debian service is not running"
}

cmd_start() {
	if ! installed; then
		echo "rabbitmq.sh: rabbitmq-server is not installed; run ./rabbitmq.sh install" >&2
		exit 1
	fi
	setenv
	if rabbitmqctl -n "$NODE" -q status >/dev/null 2>&1; then
		echo "RabbitMQ $NODE is already running"
		return
	fi
	mkdir -p "$BASE/mnesia" "$BASE/log"
	: >"$BASE/enabled_plugins"
	printf '[].\n' >"$BASE/enabled_plugins"
	cat >"$BASE/rabbitmq.conf" <<-'EOF'
		listeners.tcp.default = 127.0.0.1:5672
		loopback_users.guest = true
		log.console = false
		log.file.level = warning
	EOF
	printf '[].\n' >"$BASE/advanced.config"
	# The Debian wrappers run the node as the rabbitmq user when called as root.
	if id rabbitmq >/dev/null 2>&1; then
		chown -R rabbitmq:rabbitmq "$BASE"
	fi
	# An epmd left from elsewhere without ERL_EPMD_ADDRESS would listen on every interface; when
	# no node is registered with it, end it, so the node starts one on loopback.
	if command -v epmd >/dev/null 2>&1 && epmd -names 2>/dev/null | grep -q '^epmd: up' &&
		! epmd -names 2>/dev/null | grep -q '^name '; then
		epmd -kill >/dev/null 2>&1 || true
	fi
	rabbitmq-server -detached
	# await_startup needs a node to talk to: wait for the node to answer first.
	local i
	for i in $(seq 1 120); do
		rabbitmqctl -n "$NODE" -q status >/dev/null 2>&1 && break
		sleep 1
	done
	if ! timeout 120 rabbitmqctl -n "$NODE" -q await_startup; then
		echo "rabbitmq.sh: the node did not start; logs in $BASE/log" >&2
		exit 1
	fi
	echo "RabbitMQ $NODE up on 127.0.0.1:5672 (data and logs in $BASE)"
}

cmd_status() {
	setenv
	if rabbitmqctl -n "$NODE" -q status >/dev/null 2>&1; then
		echo "RabbitMQ $NODE is running"
	else
		echo "RabbitMQ $NODE is not running"
		# rabbitmqctl started an epmd to ask: end it (it exits only if no node is registered).
		if command -v epmd >/dev/null 2>&1; then
			epmd -kill >/dev/null 2>&1 || true
		fi
		return 1
	fi
}

cmd_stop() {
	setenv
	if installed && rabbitmqctl -n "$NODE" -q status >/dev/null 2>&1; then
		rabbitmqctl -n "$NODE" -q stop
		echo "RabbitMQ $NODE stopped"
	else
		echo "RabbitMQ $NODE was not running"
	fi
	# epmd was started by the node; it exits on -kill only if no node is registered with it.
	if command -v epmd >/dev/null 2>&1; then
		epmd -kill >/dev/null 2>&1 || true
	fi
	rm -rf "$BASE"
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
status) cmd_status ;;
stop) cmd_stop ;;
*)
	echo "usage: $0 install|start|status|stop" >&2
	exit 2
	;;
esac
