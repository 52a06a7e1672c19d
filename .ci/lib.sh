# shellcheck shell=bash
# The functions .ci/run and .ci/selftest share: start the services the
# tests need and give them the configuration the tests expect, whatever the
# machine's image did. Source it from bash with `set -euo pipefail`.
#
# What the tests expect (README, "Testing"; docs/testing.md):
#   PostgreSQL  postgres://postgres@127.0.0.1:PORT/test: user postgres with
#               no password over TCP (trust for 127.0.0.1 and ::1), a
#               database named test.
#   MariaDB     root@tcp(127.0.0.1:PORT)/test: root with an empty password
#               over TCP, with every privilege and GRANT OPTION, a database
#               named test.
# A fresh Debian gives neither: PostgreSQL 15 asks for a scram-sha-256
# password over TCP and has no database test; MariaDB's root logs in through
# the unix socket only. ensure_postgres and ensure_mariadb change that, and
# only that, and only when a login over TCP fails.

log() { printf '\n== %s\n' "$*"; }
die() {
	echo "FATAL: $*" >&2
	exit 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # name port seconds
	local _
	for _ in $(seq 1 "$3"); do
		port_open "$2" && return 0
		sleep 1
	done
	die "$1 is not reachable on 127.0.0.1:$2"
}

apt_updated=
need() { # command debian-package
	if command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; then return 0; fi
	log "installing $2"
	if [ -z "$apt_updated" ]; then
		apt-get update -qq || true
		apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null || die "cannot install $2"
}

# as_user USER COMMAND...: run a command as another system user (root
# switches without a password; anyone else goes through sudo).
as_user() {
	local u=$1
	shift
	if [ "$(id -un)" = "$u" ]; then
		"$@"
	elif [ "$(id -u)" = 0 ]; then
		runuser -u "$u" -- "$@"
	else
		sudo -n -u "$u" -- "$@"
	fi
}

# pg_bindir: the PostgreSQL server binaries the tests' own clusters use.
pg_bindir() {
	if [ -n "${OUTBOX_TEST_PG_BINDIR:-}" ]; then
		echo "$OUTBOX_TEST_PG_BINDIR"
	elif [ -x /usr/lib/postgresql/15/bin/initdb ]; then
		echo /usr/lib/postgresql/15/bin
	else
		find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n1
	fi
}

# pg_tcp_ok PORT: user postgres logs in over TCP without a password.
pg_tcp_ok() {
	env -u PGPASSWORD PGPASSFILE=/nonexistent/pgpass PGCONNECT_TIMEOUT=5 \
		psql -w -X -q "postgres://postgres@127.0.0.1:$1/postgres?sslmode=disable" -Atc 'SELECT 1' >/dev/null 2>&1
}

# ensure_postgres PORT [DATADIR]
#
# Without DATADIR: the machine's PostgreSQL cluster on PORT, installed
# (Debian's postgresql package) and started with pg_ctlcluster when it is
# not running. With DATADIR: a cluster of its own in DATADIR, created with
# initdb as a fresh Debian cluster is (peer for the socket, scram-sha-256
# over TCP) when DATADIR is empty, started on PORT with its socket in
# DATADIR and stopped by stop_postgres DATADIR.
#
# Then, either way, configure_postgres: trust over TCP from this machine and
# the database test, when they are missing.
ensure_postgres() {
	start_postgres "$@"
	configure_postgres "$1" "$(pg_sockdir "${2:-}")"
}

# pg_sockdir [DATADIR]: where the server's unix socket is.
pg_sockdir() { if [ -n "${1:-}" ]; then echo "$1"; else echo /var/run/postgresql; fi; }

# start_postgres PORT [DATADIR]: the first half of ensure_postgres (create,
# start and wait), without the configuration.
start_postgres() {
	local port=$1 datadir=${2:-} sockdir
	sockdir=$(pg_sockdir "$datadir")
	# The server binaries too: the tests of Logical mode and reliability
	# start clusters of their own (initdb, postgres).
	[ -x "$(pg_bindir)/initdb" ] || need pg_ctlcluster postgresql
	need psql postgresql-client
	if [ -n "$datadir" ]; then
		local bin
		bin=$(pg_bindir)
		if [ ! -s "$datadir/PG_VERSION" ]; then
			log "creating a PostgreSQL cluster in $datadir (initdb, Debian's defaults)"
			mkdir -p "$datadir"
			chown postgres: "$datadir" 2>/dev/null || true
			chmod 700 "$datadir"
			as_user postgres "$bin/initdb" -D "$datadir" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
				-E UTF8 --locale=C.UTF-8 --no-sync >"$datadir.initdb.log" 2>&1 ||
				die "initdb $datadir failed: $(cat "$datadir.initdb.log")"
		fi
		if ! port_open "$port"; then
			log "starting PostgreSQL in $datadir on port $port"
			as_user postgres "$bin/pg_ctl" -D "$datadir" -l "$datadir/server.log" -w -t 60 \
				-o "-p $port -k $sockdir -c listen_addresses=127.0.0.1" start >/dev/null ||
				die "PostgreSQL in $datadir did not start: $(tail -n 20 "$datadir/server.log")"
		fi
	else
		if ! port_open "$port"; then
			log "starting PostgreSQL"
			need pg_ctlcluster postgresql
			local cluster
			cluster=$(pg_lsclusters --no-header 2>/dev/null | awk -v p="$port" '$3 == p { print $1, $2; exit }')
			[ -n "$cluster" ] || die "no PostgreSQL cluster on port $port (pg_lsclusters)"
			# shellcheck disable=SC2086 # version and name
			pg_ctlcluster --skip-systemctl-redirect $cluster start || true
		fi
	fi
	wait_port PostgreSQL "$port" 60
	local _
	for _ in $(seq 1 30); do
		pg_isready -q -h 127.0.0.1 -p "$port" && break
		sleep 1
	done
	pg_isready -q -h 127.0.0.1 -p "$port" || die "PostgreSQL on 127.0.0.1:$port does not accept connections"
}

# configure_postgres PORT SOCKDIR: when user postgres cannot log in over TCP
# without a password, put trust lines for 127.0.0.1 and ::1 first in the
# cluster's pg_hba.conf (found through the socket, as the postgres system
# user: peer authentication) and reload; then create the database test.
configure_postgres() {
	local port=$1 sockdir=$2
	if ! pg_tcp_ok "$port"; then
		log "PostgreSQL on port $port: trusting logins over TCP from this machine (pg_hba.conf)"
		local hba
		hba=$(as_user postgres psql -X -h "$sockdir" -p "$port" -d postgres -Atc 'SHOW hba_file') ||
			die "cannot reach PostgreSQL on port $port through its socket in $sockdir as the postgres system user"
		{
			echo "# Added by gorm-outbox's .ci/lib.sh: the tests log in as postgres over TCP without a password."
			echo "host all all 127.0.0.1/32 trust"
			echo "host all all ::1/128 trust"
			cat "$hba"
		} >"$hba.outbox-ci"
		cat "$hba.outbox-ci" >"$hba" # keeps the file's owner and mode
		rm -f "$hba.outbox-ci"
		as_user postgres psql -X -q -h "$sockdir" -p "$port" -d postgres -Atc 'SELECT pg_reload_conf()' >/dev/null
		local _
		for _ in $(seq 1 20); do
			pg_tcp_ok "$port" && break
			sleep 0.5
		done
		pg_tcp_ok "$port" || die "PostgreSQL on 127.0.0.1:$port still refuses postgres without a password (see $hba)"
	fi
	local psql=(psql -w -X -q "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable")
	if [ "$("${psql[@]}" -Atc "SELECT count(*) FROM pg_database WHERE datname = 'test'")" = 0 ]; then
		log "PostgreSQL on port $port: creating the database test"
		"${psql[@]}" -c 'CREATE DATABASE test' >/dev/null
	fi
}

# stop_postgres DATADIR: stops a cluster ensure_postgres started in DATADIR.
stop_postgres() {
	[ -s "$1/postmaster.pid" ] || return 0
	as_user postgres "$(pg_bindir)/pg_ctl" -D "$1" -m immediate -w stop >/dev/null 2>&1 || true
}

# mariadb_tcp_ok PORT: root logs in over TCP with an empty password.
mariadb_tcp_ok() {
	mariadb --no-defaults --protocol=tcp -h 127.0.0.1 -P "$1" -uroot --connect-timeout=5 -e 'SELECT 1' >/dev/null 2>&1
}

# ensure_mariadb PORT [DATADIR]
#
# Without DATADIR: the machine's MariaDB (its own configuration says on
# which port and socket), installed and started when nothing listens on
# PORT. With DATADIR: a server of its own, its data directory made by
# mariadb-install-db as a fresh Debian's is (root through the unix socket
# only) when DATADIR is empty, listening on 127.0.0.1:PORT with its socket
# in DATADIR; stop_mariadb DATADIR stops it.
#
# Then, either way, configure_mariadb: root over TCP with an empty password
# and the database test, when they are missing.
ensure_mariadb() {
	start_mariadb "$@"
	configure_mariadb "$1" "$(mariadb_socket "${2:-}")"
}

# mariadb_socket [DATADIR]: where the server's unix socket is.
mariadb_socket() {
	if [ -n "${1:-}" ]; then
		echo "$1/mysqld.sock"
		return
	fi
	local sock
	sock=$(mariadbd --print-defaults 2>/dev/null | tr ' ' '\n' | sed -n 's/^--socket=//p' | tail -n1)
	echo "${sock:-/run/mysqld/mysqld.sock}"
}

# start_mariadb PORT [DATADIR]: the first half of ensure_mariadb (create,
# start and wait), without the configuration.
start_mariadb() {
	local port=$1 datadir=${2:-} sock
	sock=$(mariadb_socket "$datadir")
	need mariadbd mariadb-server
	need mariadb mariadb-client
	if [ -n "$datadir" ]; then
		if [ ! -d "$datadir/mysql" ]; then
			log "creating a MariaDB data directory in $datadir (mariadb-install-db)"
			mkdir -p "$datadir"
			chown mysql: "$datadir" 2>/dev/null || true
			mariadb-install-db --no-defaults --datadir="$datadir" --user=mysql \
				--auth-root-authentication-method=socket --skip-test-db >"$datadir.install.log" 2>&1 ||
				die "mariadb-install-db $datadir failed: $(tail -n 20 "$datadir.install.log")"
		fi
		if ! port_open "$port"; then
			log "starting MariaDB in $datadir on port $port"
			start-stop-daemon --start --background --pidfile "$datadir/mariadbd.pid" --exec "$(command -v mariadbd || echo /usr/sbin/mariadbd)" -- \
				--no-defaults --datadir="$datadir" --port="$port" --bind-address=127.0.0.1 --socket="$sock" \
				--pid-file="$datadir/mariadbd.pid" --log-error="$datadir/error.log" --user=mysql
		fi
	else
		if ! port_open "$port"; then
			log "starting MariaDB"
			mkdir -p "$(dirname "$sock")" && chown mysql: "$(dirname "$sock")" 2>/dev/null || true
			start-stop-daemon --start --oknodo --background --exec "$(command -v mariadbd || echo /usr/sbin/mariadbd)"
		fi
	fi
	wait_port MariaDB "$port" 60
	local _
	for _ in $(seq 1 30); do
		[ -S "$sock" ] && break
		sleep 1
	done
}

# configure_mariadb PORT SOCKET: when root cannot log in over TCP with an
# empty password, connect through the socket as the root system user
# (unix_socket authentication) and let root in over TCP: root@localhost
# keeps its socket login and gains the empty password (a TCP login from
# 127.0.0.1 is root@localhost when the server resolves names), and
# root@127.0.0.1 and root@::1 are created with every privilege (for a
# server that skips name resolution). Then create the database test.
configure_mariadb() {
	local port=$1 sock=$2
	if ! mariadb_tcp_ok "$port"; then
		log "MariaDB on port $port: letting root in over TCP with an empty password"
		as_user root mariadb --no-defaults --socket="$sock" -uroot -e "
			ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
			CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
			GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
			CREATE USER IF NOT EXISTS 'root'@'::1' IDENTIFIED BY '';
			GRANT ALL PRIVILEGES ON *.* TO 'root'@'::1' WITH GRANT OPTION;
			FLUSH PRIVILEGES;" ||
			die "cannot reach MariaDB through $sock as root to let root in over TCP"
		mariadb_tcp_ok "$port" || die "MariaDB on 127.0.0.1:$port still refuses root with an empty password"
	fi
	local _
	for _ in $(seq 1 30); do
		mariadb --no-defaults --protocol=tcp -h 127.0.0.1 -P "$port" -uroot -e 'CREATE DATABASE IF NOT EXISTS test' 2>/dev/null && return 0
		sleep 1
	done
	die "MariaDB on 127.0.0.1:$port: cannot create the database test"
}

# stop_mariadb DATADIR: stops a server ensure_mariadb started in DATADIR.
stop_mariadb() {
	[ -s "$1/mariadbd.pid" ] || return 0
	local pid _
	pid=$(cat "$1/mariadbd.pid")
	kill "$pid" 2>/dev/null || return 0
	for _ in $(seq 1 60); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.5
	done
	kill -9 "$pid" 2>/dev/null || true
}

ensure_nats() { # port
	need nats-server nats-server # the outage tests run their own copy too
	if ! port_open "$1"; then
		log "starting NATS (JetStream)"
		mkdir -p /var/lib/nats-server
		start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server || echo /usr/sbin/nats-server)" -- \
			-a 127.0.0.1 -p "$1" -js -sd /var/lib/nats-server -l /var/log/nats-server.log
	fi
	wait_port NATS "$1" 30
}

ensure_redis() { # port
	need redis-server redis-server
	if ! port_open "$1"; then
		log "starting Redis"
		mkdir -p /var/lib/redis /var/log/redis
		redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$1" --save "" --appendonly no \
			--dir /var/lib/redis --logfile /var/log/redis/ci.log
	fi
	wait_port Redis "$1" 30
}

ensure_rabbitmq() { # port
	need rabbitmq-server rabbitmq-server
	if ! port_open "$1"; then
		log "starting RabbitMQ"
		rabbitmq-server -detached || true
	fi
	wait_port RabbitMQ "$1" 120
	timeout 120 rabbitmqctl await_startup >/dev/null 2>&1 || die "RabbitMQ did not finish starting"
}
