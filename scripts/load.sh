#!/usr/bin/env bash
# Load benchmark of the client proxy (`rproxy client`) for the two load rows
# L-5 and L-7 of RELIABILITY.md. A manual benchmark: CI does not run it.
#
#   load.py ──► rproxy client (taskset -c 0) ──► nginx (a 1 KiB file, max-age=3600)
#
# Everything on 127.0.0.1. Two client proxies are started in front of one
# nginx origin; the load comes from scripts/load.py (Python 3 standard
# library, asyncio; pinned to the last core). Legitimate requests are a
# fresh connection each (200 by default, 10 ms apart; in L-7 spread over the
# attack, 40 ms apart, baseline too) for a 1 KiB file that
# is a cache hit, timed from connect to the last body byte by a separate
# process, as a baseline and then under each load.
#
# 1. L-5 idle connections: 10,000 keep-alive connections, each sends one
#    complete request, reads the response and then stays idle. Prints the
#    proxy's RSS growth (VmRSS before vs with all of them open) in MiB and
#    KiB per connection (target <= 150 MiB), and the legitimate p50/p99
#    before and during the idle load (target p99 <= 10 ms). hyper's
#    header-read timeout also closes idle keep-alive connections, so this
#    proxy runs with --header-read-timeout 120 to keep them open.
# 2. L-7 slowloris: 2,000 connections each send one byte of a request head
#    every 5 s and never finish it, against a proxy with the default
#    --header-read-timeout 10. Prints RSS growth (target <= 50 MiB), when
#    the proxy closed them (p50/p99/max from each connect; target: all by
#    timeout + 1 s) and the legitimate p99 during the attack against the
#    baseline (target <= 2x).
# 3. L-5's last clause: 10,000 idle keep-alive connections to the proxy
#    with the 10 s timeout are closed at 10 s +- 1 s after their response.
# Each figure is printed next to its target with "met" / "NOT met". The
# exit status is non-zero only when the setup failed (build, start-up,
# proxy unreachable or dead), never for a missed target. About 45 s.
#
# Usage: scripts/load.sh
#   IDLE_CONNS=10000   L-5 connections      SLOW_CONNS=2000   L-7 connections
#   CLOSE_CONNS=10000  part 3 connections (0 skips part 3)
#   LEGIT=200          legitimate requests per measurement
#   IDLE_TIMEOUT=120   --header-read-timeout of the L-5 proxy
#   SLOW_TIMEOUT=10    --header-read-timeout of the L-7 / part 3 proxy
#   RPROXY, NGINX, CARGO_TARGET_DIR, KEEP_TMP: see scripts/lib-nginx.sh
# Needs: python3 (>= 3.8), nginx, curl; taskset to pin (optional).
# `ulimit -n` is raised to the hard limit; each side needs about
# IDLE_CONNS + 1000 descriptors (RELIABILITY.md asks for >= 32768), and the
# connection counts are lowered, with a note, when the hard limit is short.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init load

idle_conns=${IDLE_CONNS:-10000}
slow_conns=${SLOW_CONNS:-2000}
close_conns=${CLOSE_CONNS:-10000}
legit=${LEGIT:-200}
idle_timeout=${IDLE_TIMEOUT:-120}
slow_timeout=${SLOW_TIMEOUT:-10}

command -v python3 >/dev/null || lab_die "python3 is not installed"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 8))' || lab_die "python3 >= 3.8 is needed"

# ---- file descriptors -------------------------------------------------------
hard=$(ulimit -Hn)
if [[ $hard == unlimited ]]; then
    ulimit -n 1048576 2>/dev/null || ulimit -n 65536 2>/dev/null || true
else
    ulimit -n "$hard" || lab_die "cannot raise ulimit -n to the hard limit $hard"
fi
nofile=$(ulimit -n)
lab_log "ulimit -n $nofile (hard $hard)"
if ((nofile < 32768)); then
    lab_log "note: ulimit -n $nofile is below the 32768 RELIABILITY.md asks for; the load generator and the proxy are separate processes, so each needs only its connections + ~1000"
fi
max_conns=$((nofile - 1000))
for var in idle_conns close_conns slow_conns; do
    if ((${!var} > max_conns)); then
        lab_log "WARNING: ulimit -n $nofile is too low for ${!var} connections: running $var with $max_conns instead"
        printf -v "$var" '%s' "$max_conns"
    fi
done

lab_build

# Pinning: the proxies on core 0, the load generator on the last core.
proxy_pin=() gen_pin=()
if command -v taskset >/dev/null 2>&1 && (($(nproc) >= 2)); then
    proxy_pin=(taskset -c 0)
    gen_pin=(taskset -c $(($(nproc) - 1)))
fi

# ---- origin and proxies ---------------------------------------------------
root=$lab_tmp/www
mkdir -p "$root/cached"
head -c 1024 /dev/urandom | base64 -w 64 | head -c 1024 >"$root/cached/1k.txt"
NGINX_ACCESS_LOG=off lab_start_nginx "$root" '
        location /cached/ { add_header Cache-Control "max-age=3600" always; }'

# start_client NAME TIMEOUT: a client proxy straight in front of nginx (an
# ordinary caching proxy: no accelerator is needed for cache hits); sets
# c_port and c_pid.
start_client() {
    local name=$1 timeout=$2
    c_port=$(lab_free_port)
    mkdir -p "$lab_tmp/cache-$name"
    RUST_LOG=${RUST_LOG:-warn} "${proxy_pin[@]}" "$lab_rproxy" client \
        --listen "127.0.0.1:$c_port" --admin-listen 127.0.0.1:0 --upstream "$lab_nginx_url" \
        --cache "$lab_tmp/cache-$name" --header-read-timeout "$timeout" \
        >"$lab_tmp/logs/client-$name.log" 2>&1 &
    c_pid=$!
    lab_pids+=("$c_pid")
    lab_wait_http "http://127.0.0.1:$c_port/.rproxy/stats" "$c_pid" "rproxy client ($name)"
    local limit
    limit=$(awk '/^Max open files/ { print $4 }' "/proc/$c_pid/limits")
    lab_log "client proxy $name: 127.0.0.1:$c_port, pid $c_pid, --header-read-timeout $timeout, open-file limit $limit ${proxy_pin[*]}"
}
start_client idle "$idle_timeout"
idle_port=$c_port idle_pid=$c_pid
start_client slow "$slow_timeout"
slow_port=$c_port slow_pid=$c_pid

url=$lab_nginx_url/cached/1k.txt
echo "rproxy client load test (L-5, L-7): $(nproc) cores, ulimit -n $nofile; proxies ${proxy_pin[*]:-unpinned}, load ${gen_pin[*]:-unpinned}"
echo "legitimate requests: $legit, one fresh connection each, GET $url (a cache hit), 10 ms apart"
status=0
"${gen_pin[@]}" python3 "$lab_repo/scripts/load.py" run --url "$url" \
    --idle-port "$idle_port" --idle-pid "$idle_pid" --idle-timeout "$idle_timeout" --idle-conns "$idle_conns" \
    --slow-port "$slow_port" --slow-pid "$slow_pid" --slow-timeout "$slow_timeout" --slow-conns "$slow_conns" \
    --close-conns "$close_conns" --legit "$legit" || status=$?
if ((status != 0)); then
    lab_show_logs
    lab_die "the load generator failed (status $status)"
fi
lab_check_alive
# Errors the proxies logged during the run (warnings are expected: hyper
# logs each header-read timeout).
for name in idle slow; do
    n=$(grep -c -e panicked -e ' ERROR ' "$lab_tmp/logs/client-$name.log" || true)
    if ((n > 0)); then
        echo "client proxy $name logged $n error/panic lines, e.g.:"
        grep -m 3 -e panicked -e ' ERROR ' "$lab_tmp/logs/client-$name.log"
    fi
done
