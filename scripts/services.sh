# shellcheck shell=bash
# Sourced by scripts/test, scripts/demo and bench/: makes sure this machine has what Sluice's
# tests and demo need, installing or starting what is missing:
#   - the wasm32-wasip2 Rust target (plugins are built for it)
#   - PostgreSQL answering on 127.0.0.1:5432 (started if installed but down)
#   - MariaDB (or MySQL) answering on 127.0.0.1:3306, user root without password, database
#     `test` (started if installed but down; the MySQL tests need it)
#   - Tansu, a Kafka-API broker, listening on 127.0.0.1:9092 (installed from crates.io if
#     missing, ~25 min once per machine, into $TANSU_ROOT; started in the background if not
#     listening); its path is exported as TANSU_BIN for the tests and the benchmarks
#   - promtool (Debian's `prometheus` package, installed with apt-get if missing): checks the
#     shipped alert rules and the /metrics exposition
#   - docker-registry and minisign (Debian packages, installed if missing): the plugin
#     supply-chain tests start their own OCI registry and sign with minisign

# The checkout this file is in, unless the sourcing script set it (plugins are built there).
REPO="${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
TANSU_VERSION="${TANSU_VERSION:-0.6.0}"
TANSU_PORT="${TANSU_PORT:-9092}"
PG_HOST="${PG_HOST:-127.0.0.1}"
PG_PORT="${PG_PORT:-5432}"
MYSQL_HOST="${MYSQL_HOST:-127.0.0.1}"
MYSQL_PORT="${MYSQL_PORT:-3306}"
SLUICE_STATE_DIR="${SLUICE_STATE_DIR:-${TMPDIR:-/tmp}/sluice-services}"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

ensure_wasm_target() {
    if ! rustup target list --installed | grep -qx wasm32-wasip2; then
        log "installing Rust target wasm32-wasip2"
        rustup target add wasm32-wasip2
    fi
}

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

ensure_postgres() {
    if pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; then
        return
    fi
    if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
        local version
        version="$(ls /etc/postgresql | sort -V | tail -n1)"
        log "PostgreSQL is down; starting cluster $version/main"
        pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
        for _ in $(seq 1 60); do
            pg_isready -q -h "$PG_HOST" -p "$PG_PORT" && return
            sleep 0.5
        done
    fi
    die "PostgreSQL does not answer on $PG_HOST:$PG_PORT (and could not be started here)"
}

ensure_mariadb() {
    if ! port_open "$MYSQL_HOST" "$MYSQL_PORT" && [ -x /usr/sbin/mariadbd ]; then
        log "MariaDB is down; starting it"
        start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
        for _ in $(seq 1 60); do
            port_open "$MYSQL_HOST" "$MYSQL_PORT" && break
            sleep 0.5
        done
    fi
    if ! port_open "$MYSQL_HOST" "$MYSQL_PORT"; then
        die "MariaDB/MySQL does not answer on $MYSQL_HOST:$MYSQL_PORT (and could not be started here); the MySQL tests need it (root without password, database test; or set SLUICE_TEST_MYSQL_URL)"
    fi
    # The tests' database, if a client is at hand to make sure of it.
    if command -v mysql >/dev/null; then
        mysql -h "$MYSQL_HOST" -P "$MYSQL_PORT" -u root -e "CREATE DATABASE IF NOT EXISTS test" \
            || die "cannot log in to MariaDB on $MYSQL_HOST:$MYSQL_PORT as root without password"
    fi
}

# The other brokers Sluice publishes to (docs/brokers.md), on this machine kind's ports. Each is
# started if installed but down (with the command this machine kind starts it with), or the
# script says what is missing.
NATS_PORT="${NATS_PORT:-4222}"
RABBITMQ_PORT="${RABBITMQ_PORT:-5672}"
REDIS_PORT="${REDIS_PORT:-6379}"

# wait_port NAME PORT: up to 60 s for 127.0.0.1:PORT to accept connections.
wait_port() {
    for _ in $(seq 1 120); do
        port_open 127.0.0.1 "$2" && return 0
        sleep 0.5
    done
    return 1
}

ensure_nats() {
    if ! port_open 127.0.0.1 "$NATS_PORT" && [ -x /usr/sbin/nats-server ]; then
        log "NATS is down; starting it with JetStream"
        mkdir -p /var/lib/nats-server 2>/dev/null || true
        start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
            -a 127.0.0.1 -p "$NATS_PORT" -js -sd /var/lib/nats-server -l /var/log/nats-server.log || true
        wait_port nats "$NATS_PORT" || true
    fi
    port_open 127.0.0.1 "$NATS_PORT" \
        || die "NATS does not answer on 127.0.0.1:$NATS_PORT (and could not be started here); the NATS tests need it with JetStream on (nats-server -js; or set SLUICE_TEST_NATS)"
}

ensure_rabbitmq() {
    if ! port_open 127.0.0.1 "$RABBITMQ_PORT" && command -v rabbitmq-server >/dev/null; then
        log "RabbitMQ is down; starting it"
        rabbitmq-server -detached || true
        wait_port rabbitmq "$RABBITMQ_PORT" || true
    fi
    port_open 127.0.0.1 "$RABBITMQ_PORT" \
        || die "RabbitMQ does not answer on 127.0.0.1:$RABBITMQ_PORT (and could not be started here); the RabbitMQ tests need it (guest/guest; or set SLUICE_TEST_RABBITMQ)"
}

ensure_redis() {
    if ! port_open 127.0.0.1 "$REDIS_PORT" && command -v redis-server >/dev/null; then
        log "Redis is down; starting it"
        mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
        redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" \
            --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
        wait_port redis "$REDIS_PORT" || true
    fi
    port_open 127.0.0.1 "$REDIS_PORT" \
        || die "Redis does not answer on 127.0.0.1:$REDIS_PORT (and could not be started here); the Redis tests need it (or set SLUICE_TEST_REDIS)"
}

# The features the tests need: dynostore (the memory storage engine) and libsql (the SQLite
# one, the only engine here that keeps SCRAM users: tests/tests/e2e/secure_kafka.rs; see
# docs/security.md, "Testing against Tansu"). Installed into a root of its own, named by
# version and features, so a tansu built otherwise (on PATH, in ~/.cargo/bin) is never taken
# for it.
TANSU_FEATURES="dynostore,libsql"
TANSU_ROOT="${TANSU_ROOT:-$HOME/.local/share/sluice/tansu-$TANSU_VERSION-${TANSU_FEATURES//,/-}}"

tansu_bin() {
    if [ -x "$TANSU_ROOT/bin/tansu" ]; then
        echo "$TANSU_ROOT/bin/tansu"
    fi
}

# install_tansu: sets TANSU_BIN, installing tansu first where this machine has none.
install_tansu() {
    if [ -z "$(tansu_bin)" ]; then
        log "installing tansu $TANSU_VERSION ($TANSU_FEATURES) from crates.io into $TANSU_ROOT (once per machine; ~25 min on 2 cores)"
        cargo install tansu --version "$TANSU_VERSION" --features "$TANSU_FEATURES" --locked \
            --root "$TANSU_ROOT"
    fi
    export TANSU_BIN
    TANSU_BIN="$(tansu_bin)"
}

# start_tansu PORT LOG: an in-memory broker on 127.0.0.1:PORT in the background, detached from
# this shell, logging to LOG; returns once it listens, with its pid in TANSU_PID.
start_tansu() {
    setsid nohup "$TANSU_BIN" broker \
        --listener-url "tcp://127.0.0.1:$1" \
        --advertised-listener-url "tcp://127.0.0.1:$1" \
        --storage-engine memory://tansu/ \
        >"$2" 2>&1 </dev/null &
    TANSU_PID=$!
    for _ in $(seq 1 100); do
        port_open 127.0.0.1 "$1" && return
        sleep 0.1
    done
    die "tansu did not start listening on 127.0.0.1:$1; see $2"
}

# ensure_tansu: tansu installed, and a broker on TANSU_PORT (the tests' and the benchmark's).
ensure_tansu() {
    install_tansu
    if port_open 127.0.0.1 "$TANSU_PORT"; then
        return
    fi
    mkdir -p "$SLUICE_STATE_DIR"
    log "starting tansu on 127.0.0.1:$TANSU_PORT (log: $SLUICE_STATE_DIR/tansu.log)"
    start_tansu "$TANSU_PORT" "$SLUICE_STATE_DIR/tansu.log"
}

# create_topics NAME... : 3 partitions each; existing topics are left alone. Works without
# ensure_tansu in the same shell (a broker started earlier), as long as tansu is installed.
create_topics() {
    local topic out bin="${TANSU_BIN:-$(tansu_bin)}"
    [ -n "$bin" ] || die "tansu is not installed under $TANSU_ROOT: run ensure_tansu (scripts/test does)"
    for topic in "$@"; do
        if ! out="$("$bin" topic create "$topic" --broker "tcp://127.0.0.1:$TANSU_PORT" --partitions 3 2>&1)"; then
            case "$out" in
                *xist*) ;;
                *) die "cannot create topic $topic: $out" ;;
            esac
        fi
    done
}

# apt_install_tools PACKAGE...: installs Debian packages for their tools only: a package's
# service must not start here (policy-rc.d refuses it while apt runs).
apt_install_tools() {
    command -v apt-get >/dev/null || return 0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        local remove_policy=1
    fi
    { apt-get install -y --no-install-recommends "$@" >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y --no-install-recommends "$@" >/dev/null; }; } \
        || true
    [ "${remove_policy:-0}" = 1 ] && rm -f /usr/sbin/policy-rc.d
    return 0
}

# ensure_debian_tools "NEEDED..." PACKAGE...: every NEEDED (a command, or the absolute path of
# a file) present, else PACKAGEs installed from Debian (apt_install_tools) and checked again.
ensure_debian_tools() {
    local needed="$1"
    shift
    debian_tools_present() {
        local each
        for each in $needed; do
            case "$each" in
                /*) [ -e "$each" ] || return 1 ;;
                *) command -v "$each" >/dev/null || return 1 ;;
            esac
        done
    }
    debian_tools_present && return
    log "installing $* (Debian packages)"
    apt_install_tools "$@"
    debian_tools_present \
        || die "${needed// / or } is missing and could not be installed (apt-get install $*)"
}

ensure_promtool() { ensure_debian_tools promtool prometheus; }

# The plugin supply-chain tests (tests/tests/e2e/supply_chain.rs) run a real OCI registry
# (Debian's docker-registry, started by each test on its own port) and sign with Debian's
# minisign.
ensure_oci_tools() { ensure_debian_tools "docker-registry minisign" docker-registry minisign; }

# A cold run of scripts/test writes about 10 GiB (the debug build of the workspace and its
# tests, the release build of the package checks, the plugins, Tansu's build); a disk that
# fills half-way fails a build with an I/O error that names no cause. Checked first, so the
# run stops at once and says what is missing. SLUICE_MIN_FREE_GIB overrides the estimate.
ensure_disk_space() {
    local target="${CARGO_TARGET_DIR:-$REPO/target}" need="${SLUICE_MIN_FREE_GIB:-}" dir
    if [ -z "$need" ]; then
        # A warm target dir only grows by what changed.
        if [ -d "$target/debug/deps" ]; then need=5; else need=15; fi
    fi
    dir="$target"
    while [ ! -d "$dir" ]; do dir="$(dirname "$dir")"; done
    local free_gib mount
    free_gib="$(df -Pk "$dir" | awk 'NR == 2 { print int($4 / 1048576) }')"
    mount="$(df -Pk "$dir" | awk 'NR == 2 { print $6 }')"
    if [ "$free_gib" -lt "$need" ]; then
        die "only $free_gib GiB free on $mount, which holds $target; this run needs about $need GiB (builds, plugins, Tansu). Free some space (old target directories: cargo clean) or set SLUICE_MIN_FREE_GIB."
    fi
    log "disk: $free_gib GiB free on $mount (about $need GiB needed)"
}

ensure_services() {
    ensure_promtool
    ensure_oci_tools
    ensure_wasm_target
    ensure_postgres
    ensure_mariadb
    ensure_nats
    ensure_rabbitmq
    ensure_redis
    ensure_tansu
}

# Plugins are built into their workspaces' own target/ even when CARGO_TARGET_DIR is set:
# examples, tests and the benchmark name them there.
build_plugins() {
    ensure_wasm_target
    log "building plugins (wasm32-wasip2)"
    (cd "$REPO/plugins" && cargo build --release --target wasm32-wasip2 --quiet \
        --target-dir "$REPO/plugins/target")
}

build_test_plugins() {
    ensure_wasm_target
    log "building test plugins (wasm32-wasip2)"
    (cd "$REPO/tests/plugins" && cargo build --release --target wasm32-wasip2 --quiet \
        --target-dir "$REPO/tests/plugins/target")
}
