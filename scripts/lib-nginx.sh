# shellcheck shell=bash
# Shared by scripts/e2e.sh and scripts/bench-proxy.sh (sourced, not run):
# a throw-away nginx origin, the rproxy pair in front of it, and the small
# helpers both need (free ports, readiness, stats counters, cleanup).
#
# The caller sets `set -euo pipefail`, sources this file, then calls
# lab_init NAME; everything lives under "$lab_tmp" and every process started
# here is stopped by the EXIT trap that lab_init installs (on success, on
# failure and on Ctrl-C).
#
# Environment honoured:
#   CARGO_TARGET_DIR   where `cargo build --release` puts the binary
#   RPROXY=PATH        use this rproxy binary, do not build
#   NGINX=PATH         use this nginx (default: PATH, then /usr/sbin)
#   KEEP_TMP=1         keep the temp dir (logs, configs) after the run

lab_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lab_name=lab
lab_tmp=""
lab_pids=()

lab_die() {
    echo "$lab_name: FAIL: $*" >&2
    exit 1
}

lab_log() {
    echo "$lab_name: $*" >&2
}

# Stops what we started (by pid, newest first), then removes the temp dir.
lab_cleanup() {
    local status=$?
    local i pid
    for ((i = ${#lab_pids[@]} - 1; i >= 0; i--)); do
        pid=${lab_pids[i]}
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${lab_pids[@]}"; do
        # Give each a moment to exit, then insist.
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    lab_pids=()
    if [[ -n $lab_tmp && -d $lab_tmp ]]; then
        if [[ ${KEEP_TMP:-0} == 1 ]]; then
            echo "$lab_name: kept $lab_tmp" >&2
        else
            rm -rf "$lab_tmp"
        fi
    fi
    if ((status != 0)); then
        echo "$lab_name: exit status $status" >&2
    fi
    exit "$status"
}

# On failure, the last lines of every log help more than the message alone.
lab_show_logs() {
    local f
    [[ -n $lab_tmp && -d $lab_tmp/logs ]] || return 0
    for f in "$lab_tmp"/logs/*; do
        [[ -s $f ]] || continue
        echo "---- ${f##*/} (last 20 lines)" >&2
        tail -n 20 "$f" >&2
    done
}

lab_init() {
    lab_name=$1
    lab_tmp=$(mktemp -d "${TMPDIR:-/tmp}/rproxy-$lab_name.XXXXXX")
    mkdir -p "$lab_tmp/logs"
    trap lab_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    for tool in curl cmp; do
        command -v "$tool" >/dev/null || lab_die "$tool is not installed"
    done
}

# nginx lives in /usr/sbin on Debian, which a non-root PATH often lacks.
lab_find_nginx() {
    if [[ -n ${NGINX:-} ]]; then
        [[ -x $NGINX ]] || lab_die "NGINX=$NGINX is not executable"
        echo "$NGINX"
        return
    fi
    local found
    if found=$(command -v nginx 2>/dev/null); then
        echo "$found"
    elif [[ -x /usr/sbin/nginx ]]; then
        echo /usr/sbin/nginx
    elif [[ -x /usr/local/sbin/nginx ]]; then
        echo /usr/local/sbin/nginx
    else
        lab_die "nginx not found (install it: apt-get install -y --no-install-recommends nginx)"
    fi
}

# The release binary, built unless RPROXY names one.
lab_build() {
    if [[ -n ${RPROXY:-} ]]; then
        [[ -x $RPROXY ]] || lab_die "RPROXY=$RPROXY is not executable"
        lab_rproxy=$RPROXY
        return
    fi
    local target=${CARGO_TARGET_DIR:-$lab_repo/target}
    lab_log "building the release binary (target dir $target)"
    (cd "$lab_repo" && cargo build --release --quiet) || lab_die "cargo build --release failed"
    lab_rproxy=$target/release/rproxy
    [[ -x $lab_rproxy ]] || lab_die "no binary at $lab_rproxy after the build"
}

# A free loopback TCP port: bind port 0 and report what the kernel chose.
# Without python3, probe random high ports until one refuses connections.
lab_free_port() {
    # Below the kernel's ephemeral range (32768 and up by default): a port
    # bound to 0 and released comes from that range, where an outgoing
    # connection (curl, a proxy to its upstream) may take it before the
    # server that was meant to binds it.
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import random, socket
for _ in range(1000):
    port = random.randrange(20000, 32768)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port below 32768")'
        return
    fi
    local port
    for _ in $(seq 100); do
        port=$((20000 + RANDOM % 12768))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    lab_die "no free port found"
}

# lab_wait_http URL PID WHAT [SECONDS]: poll until URL answers (any HTTP
# status), failing early if PID died.
lab_wait_http() {
    local url=$1 pid=$2 what=$3 timeout=${4:-20}
    local deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            lab_show_logs
            lab_die "$what exited during start-up (see its log above)"
        fi
        if curl -s -o /dev/null --max-time 1 "$url"; then
            return 0
        fi
        sleep 0.1
    done
    lab_show_logs
    lab_die "$what did not answer $url within ${timeout}s"
}

# lab_start_nginx ROOT [EXTRA_SERVER_CONFIG [EXTRA_HTTP_CONFIG]]: serves
# ROOT on a free loopback port (NGINX_PORT, if set, instead) as its default
# server (server_name localhost); sets lab_nginx_port and lab_nginx_url.
# EXTRA_SERVER_CONFIG is pasted inside that server block (locations, for
# instance), EXTRA_HTTP_CONFIG after it in the http block (more server
# blocks: virtual hosts on $lab_nginx_port or on ports of their own, a TLS
# server).
lab_start_nginx() {
    local root=$1 extra=${2:-} extra_http=${3:-}
    local nginx prefix conf user_line=""
    nginx=$(lab_find_nginx)
    prefix=$lab_tmp/nginx
    mkdir -p "$prefix/temp"
    lab_nginx_port=${NGINX_PORT:-$(lab_free_port)}
    lab_nginx_url=http://127.0.0.1:$lab_nginx_port
    # As root, nginx runs its workers as nobody unless told otherwise; they
    # then could not read a root-owned temp dir. Make the tree readable and
    # keep the workers as the current user.
    chmod -R a+rX "$lab_tmp"
    if ((EUID == 0)); then
        user_line="user root root;"
    fi
    # The access log adds each request's Via, so a script can tell the
    # requests that came through the pair from any that did not, and the
    # Host, Forwarded and X-Forwarded-For the origin was sent (nginx writes
    # a `"` inside a field as \x22).
    local access_log=${NGINX_ACCESS_LOG:-$lab_tmp/logs/nginx-access.log}
    [[ $access_log == off ]] || access_log="$access_log lab"
    conf=$prefix/nginx.conf
    cat >"$conf" <<EOF
$user_line
daemon off;
master_process on;
worker_processes ${NGINX_WORKERS:-1};
pid $prefix/nginx.pid;
error_log $lab_tmp/logs/nginx-error.log warn;
events {
    worker_connections 4096;
}
http {
    log_format lab '\$remote_addr - \$remote_user [\$time_local] "\$request" \$status \$body_bytes_sent "\$http_referer" "\$http_user_agent" via="\$http_via" host="\$http_host" fwd="\$http_forwarded" xff="\$http_x_forwarded_for"';
    access_log $access_log;
    client_body_temp_path $prefix/temp/client_body;
    proxy_temp_path $prefix/temp/proxy;
    fastcgi_temp_path $prefix/temp/fastcgi;
    uwsgi_temp_path $prefix/temp/uwsgi;
    scgi_temp_path $prefix/temp/scgi;
    types {
        text/html html;
        text/css css;
        application/javascript js;
        application/octet-stream bin;
        text/plain txt;
    }
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$lab_nginx_port;
        server_name localhost;
        root $root;
$extra
    }
$extra_http
}
EOF
    "$nginx" -t -p "$prefix" -c "$conf" >"$lab_tmp/logs/nginx-test.log" 2>&1 ||
        { cat "$lab_tmp/logs/nginx-test.log" >&2; lab_die "nginx rejected the generated config $conf"; }
    "$nginx" -p "$prefix" -c "$conf" >>"$lab_tmp/logs/nginx-error.log" 2>&1 &
    lab_nginx_pid=$!
    lab_pids+=("$lab_nginx_pid")
    lab_wait_http "$lab_nginx_url/" "$lab_nginx_pid" nginx
}

# lab_start_pair [CLIENT_WRAPPER...]: the accelerator in front of nginx and
# the client proxy in front of the accelerator, on free loopback ports.
# Words given are put before the client's command (e.g. taskset -c 0).
# Sets lab_accel_url, lab_client_port, lab_client_url, lab_proxy.
lab_start_pair() {
    lab_start_accelerator
    lab_start_client "$lab_accel_url" "$@"
}

# lab_start_accelerator: the accelerator in front of nginx on a free
# loopback port. Sets lab_accel_url, lab_accel_pid.
lab_start_accelerator() {
    local accel_port accel_args=()
    # ACCEL_ARGS: more accelerator flags (e.g. "--bulk-level -1").
    read -r -a accel_args <<<"${ACCEL_ARGS:-}"
    accel_port=$(lab_free_port)
    lab_accel_url=http://127.0.0.1:$accel_port
    # The spool (and the basis store's disk tier, rproxy-basis in it) in
    # the lab's own directory: another accelerator on this machine may
    # hold the default one, and a run leaves nothing behind.
    mkdir -p "$lab_tmp/spool"
    RUST_LOG=${RUST_LOG:-warn} "$lab_rproxy" accelerator \
        --listen "127.0.0.1:$accel_port" --admin-listen 127.0.0.1:0 --origin "$lab_nginx_url" \
        --spool-dir "$lab_tmp/spool" "${accel_args[@]}" \
        >"$lab_tmp/logs/accelerator.log" 2>&1 &
    lab_accel_pid=$!
    lab_pids+=("$lab_accel_pid")
    lab_wait_http "$lab_accel_url/.rproxy/stats" "$lab_accel_pid" "rproxy accelerator"
}

# lab_start_client UPSTREAM_URL [CLIENT_WRAPPER...]: the client proxy with
# UPSTREAM_URL as its upstream (the accelerator, or a relay in front of
# it), caching in $lab_tmp/cache. Sets lab_client_port, lab_client_url,
# lab_proxy, lab_client_pid.
lab_start_client() {
    local upstream=$1 client_port client_args=()
    shift
    # CLIENT_ARGS: more client proxy flags (e.g. "--access-log off").
    read -r -a client_args <<<"${CLIENT_ARGS:-}"
    client_port=$(lab_free_port)
    # shellcheck disable=SC2034 # read by the scripts that source this file
    lab_client_port=$client_port
    lab_client_url=http://127.0.0.1:$client_port
    # shellcheck disable=SC2034 # read by the scripts that source this file
    lab_proxy=$lab_client_url
    mkdir -p "$lab_tmp/cache"
    RUST_LOG=${RUST_LOG:-warn} "$@" "$lab_rproxy" client \
        --listen "127.0.0.1:$client_port" --admin-listen 127.0.0.1:0 --upstream "$upstream" \
        --cache "$lab_tmp/cache" --cache-size "${CACHE_SIZE:-2G}" "${client_args[@]}" \
        >"$lab_tmp/logs/client.log" 2>&1 &
    lab_client_pid=$!
    lab_pids+=("$lab_client_pid")
    lab_wait_http "$lab_client_url/.rproxy/stats" "$lab_client_pid" "rproxy client"
}

# lab_start_relay TARGET_URL: scripts/byte-relay.py on a free loopback
# port, relaying to TARGET_URL's host and port and counting the bytes both
# ways (TCP payload: heads, signatures, bodies). Sets lab_relay_url (give
# it to lab_start_client as the upstream) and lab_relay_stats_url, whose
# counters `up`, `down` and `connections` lab_stats and lab_field read.
lab_start_relay() {
    local target=${1#http://} port control
    target=${target%%/*}
    command -v python3 >/dev/null || lab_die "python3 is not installed (the byte-counting relay needs it)"
    port=$(lab_free_port)
    control=$(lab_free_port)
    python3 "$lab_repo/scripts/byte-relay.py" "$port" "${target%:*}" "${target##*:}" "$control" \
        >"$lab_tmp/logs/relay.log" 2>&1 &
    lab_relay_pid=$!
    lab_pids+=("$lab_relay_pid")
    lab_proc_names[$lab_relay_pid]="byte-relay.py"
    # shellcheck disable=SC2034 # read by the scripts that source this file
    lab_relay_url=http://127.0.0.1:$port
    lab_relay_stats_url=http://127.0.0.1:$control
    lab_wait_http "$lab_relay_stats_url/" "$lab_relay_pid" "byte-relay.py"
}

# lab_start_rproxy NAME ROLE CONFIG URL: `rproxy ROLE --config CONFIG`
# (a TOML file), its log in logs/NAME.log, ready once URL/.rproxy/stats
# answers. Sets lab_started_pid.
lab_start_rproxy() {
    local name=$1 role=$2 config=$3 url=$4 own=()
    # The admin listener on a port of its own choosing: five proxies share
    # this machine, and the default ports are one per role. So does an
    # accelerator's spool (its disk basis store is locked per process).
    if [[ $role == accelerator ]]; then
        mkdir -p "$lab_tmp/spool-$name"
        own=(--spool-dir "$lab_tmp/spool-$name")
    fi
    RUST_LOG=${RUST_LOG:-warn} "$lab_rproxy" "$role" --config "$config" --admin-listen 127.0.0.1:0 \
        "${own[@]}" >"$lab_tmp/logs/$name.log" 2>&1 &
    lab_started_pid=$!
    lab_pids+=("$lab_started_pid")
    lab_proc_names[$lab_started_pid]="rproxy $role $name"
    lab_wait_http "$url/.rproxy/stats" "$lab_started_pid" "rproxy $role $name"
}

# What each process lab_start_rproxy started is, for lab_check_alive.
declare -A lab_proc_names=()

# Every process started must still be running; a crash shows here, not as
# a confusing curl error later.
lab_check_alive() {
    local pid what
    for pid in "${lab_pids[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            case $pid in
                "${lab_accel_pid:-}") what="rproxy accelerator" ;;
                "${lab_client_pid:-}") what="rproxy client" ;;
                "${lab_nginx_pid:-}") what=nginx ;;
                *) what=${lab_proc_names[$pid]:-process $pid} ;;
            esac
            lab_show_logs
            lab_die "$what (pid $pid) is no longer running"
        fi
    done
}

# lab_stats URL: the stats JSON of one proxy (flat object of integers).
lab_stats() {
    curl -sS --fail --max-time 5 "$1/.rproxy/stats" || lab_die "cannot read stats from $1"
}

# lab_field JSON NAME: one integer counter out of a stats object.
lab_field() {
    local value
    value=$(sed -n "s/.*\"$2\":\([0-9][0-9]*\).*/\1/p" <<<"$1")
    [[ -n $value ]] || lab_die "stats have no counter '$2': $1"
    echo "$value"
}

# lab_wait_field URL NAME MIN [SECONDS]: the counter once it reaches MIN
# (proxies update some counters just after the body's last byte left).
lab_wait_field() {
    local url=$1 name=$2 min=$3 timeout=${4:-5}
    local deadline=$((SECONDS + timeout)) value
    while :; do
        value=$(lab_field "$(lab_stats "$url")" "$name")
        if ((value >= min)) || ((SECONDS >= deadline)); then
            echo "$value"
            return
        fi
        sleep 0.05
    done
}

# Bytes of a file.
lab_size() {
    wc -c <"$1" | tr -d ' '
}

# The corpus folder next to the repository, if any.
lab_corpus() {
    local corpus=${CORPUS:-$lab_repo/../shared/corpus}
    if [[ -d $corpus ]]; then
        (cd "$corpus" && pwd)
    fi
}

# lab_corpus_chains CORPUS: the release chains of CORPUS/MANIFEST's `seq`
# lines into the array `chains`, one "RELEASE RELEASE ..." string each, in
# order (a seq line whose basis is the last release of a chain extends it;
# any other starts a new one). Dies on a line naming a missing file, or
# when there is no chain.
lab_corpus_chains() {
    local corpus=$1 kind basis new c
    chains=()
    local -A chain_of_tail=()
    while read -r kind basis new _; do
        [[ ${kind:-} == seq ]] || continue
        [[ -f $corpus/$basis && -f $corpus/${new:-} ]] || lab_die "bad MANIFEST line (missing field or file): $kind $basis ${new:-}"
        if [[ -v chain_of_tail[$basis] ]]; then
            c=${chain_of_tail[$basis]}
            unset 'chain_of_tail[$basis]'
            chains[c]+=" $new"
        else
            c=${#chains[@]}
            chains+=("$basis $new")
        fi
        chain_of_tail[$new]=$c
    done <"$corpus/MANIFEST"
    ((${#chains[@]} > 0)) || lab_die "no seq lines in $corpus/MANIFEST"
}
