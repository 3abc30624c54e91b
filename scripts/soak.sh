#!/usr/bin/env bash
# Soak test of both roles against readers that stop reading and a burst of
# ordinary fetches, rows L-13 and L-14 of RELIABILITY.md, with nginx as a
# reverse proxy (proxy_pass) to the same origin under the same load in the
# same run. A manual benchmark: CI does not run it.
#
#   soak.py ──► rproxy client ══ hsync ══► rproxy accelerator ──► nginx origin
#   soak.py ──► nginx proxy_pass ───────────────────────────────► nginx origin
#   soak.py ══ TLS, h2 ══► rproxy accelerator (--tls-cert) ─────► nginx origin
#   soak.py ══ TLS, h2 ══► nginx proxy_pass (listen ssl http2) ─► nginx origin
#
# Everything on 127.0.0.1, release binaries, default flags.
#
# (a) L-13, slow readers: N connections (SLOW_CONNS, default 1000) each ask
#     for a large body (BIG_MB, default 8 MB of random base64: no repeats,
#     so every coded byte is a literal) and, once the response head came,
#     never read again (receive buffer 64 KiB). Three runs, one target each:
#       accelerator   GET /big/body.txt with Accept-Encoding: hsync (a
#                     from-scratch coded stream, as a client proxy without a
#                     basis asks), straight at the accelerator;
#       client proxy  GET http://origin/big/body.txt?n=I through the client
#                     proxy, which fetches it coded from the accelerator
#                     (distinct URLs: no coalescing; no-store: no cache);
#       nginx proxy   the same path through nginx proxy_pass
#                     (proxy_max_temp_file_size 0: it buffers in memory and
#                     stops reading upstream, as the pair does, rather than
#                     spooling 8 GB to disk).
#     With all of them stalled (after SETTLE seconds), a bystander process
#     sends 200 small requests (a 1 KiB file, coded for the pair, a fresh
#     connection each, 10 ms apart). Prints per process: VmRSS before and
#     stalled, the growth, Threads, and the bystander's p50/p99. Targets:
#     growth <= 256 MiB per process, p99 <= 100 ms, threads <= pools + a
#     constant.
# (a2) L-13 over HTTP/2 with a zero window (H2=0 skips it), after (a): the
#     same SLOW_CONNS readers as streams, H2_STREAMS (default 100) to a TLS
#     connection (ALPN h2; 100 stays under the accelerator's default
#     --max-streams and nginx's http2_max_concurrent_streams, both 128, so
#     none is refused), each stream opened with SETTINGS_INITIAL_WINDOW_SIZE
#     = 0 and never given a WINDOW_UPDATE: the server may send the response
#     head (HEADERS are not flow-controlled), then not one byte of DATA.
#     nginx 1.22 holds the head back until DATA may follow it, so its
#     "heads" reads 0 (the wait for heads ends after 5 s without a new
#     one). SETTLE plus the bystander must stay under the accelerator's
#     --idle-timeout (60 s), which closes a connection where no byte moves;
#     a connection closed early is reported under the row. The h1 proxies are
#     stopped first; two fresh processes, one certificate (a throw-away
#     self-signed P-256 one from openssl):
#       accelerator   a second accelerator with --tls-cert/--tls-key, GET
#                     /big/body.txt with accept-encoding: hsync (as a client
#                     proxy with an https:// upstream asks, over h2);
#       nginx proxy   nginx proxy_pass with `listen ssl http2`, as in (a).
#     The client proxy is not measured here: its listener serves plain
#     HTTP/1.1 only (it has no --tls-cert; h2 is only its upstream side), so
#     no user agent can hold an h2 stream open on it. With TLS on, the
#     accelerator's one listener is TLS only, so the bystander is a fresh
#     h2 connection per request to it (the same for nginx). Same figures
#     and targets as (a).
# (b) L-14, burst: BURST (default 300) concurrent GETs of distinct 2 MB files
#     (random base64) through the pair, then through nginx proxy_pass, each
#     body checked against the file. Prints per process: VmRSS before, the
#     peak (VmHWM, reset just before the burst; and sampled VmRSS every
#     50 ms) and VmRSS 30 s after the burst. Targets: peak <= 512 MiB, and
#     30 s after <= start + 64 MiB + the configured memory caches. The
#     three proxies are restarted before (b); what (a) left resident in
#     them is logged first.
# Ratios against nginx follow each table. Figures are printed next to their
# targets with "met" / "NOT met"; the exit status is non-zero only when the
# setup failed (build, start-up, a proxy died). About 5.5 minutes (a2:
# about 2 of them).
#
# Usage: scripts/soak.sh
#   SLOW_CONNS=1000   (a) connections, (a2) streams
#   BIG_MB=8          (a), (a2) body size
#   H2_STREAMS=100    (a2) streams per h2 connection
#   H1=0              skip (a)               H2=0          skip (a2)
#   SETTLE=45         (a), (a2) seconds between the last stalled head and measuring
#                     (long enough for the proxies to park the stalled
#                     bodies on disk: earlier, the transfers still run)
#   BURST=300         (b) concurrent fetches (0 skips (b))  BURST_MB=2  (b) body size
#   AFTER=30          (b) seconds after the burst for the second RSS
#   RPROXY, NGINX, CARGO_TARGET_DIR, KEEP_TMP: see scripts/lib-nginx.sh
# Needs: python3 (>= 3.8), nginx, curl, base64; for (a2) openssl and an nginx
# with the ssl and http2 modules.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init soak

slow_conns=${SLOW_CONNS:-1000}
big_mb=${BIG_MB:-8}
settle=${SETTLE:-45}
burst=${BURST:-300}
burst_mb=${BURST_MB:-2}
after=${AFTER:-30}
run_h1=${H1:-1}
run_h2=${H2:-1}
h2_streams=${H2_STREAMS:-100}

command -v python3 >/dev/null || lab_die "python3 is not installed"
if ((run_h2)); then
    command -v openssl >/dev/null || lab_die "openssl is not installed (H2=0 skips the h2 runs)"
fi
hard=$(ulimit -Hn)
if [[ $hard == unlimited ]]; then
    ulimit -n 1048576 2>/dev/null || ulimit -n 65536 2>/dev/null || true
else
    ulimit -n "$hard" || true
fi
(($(ulimit -n) > 3 * slow_conns + 1000)) ||
    lab_log "note: ulimit -n $(ulimit -n) may be short for $slow_conns connections"

lab_build

# ---- origin content ---------------------------------------------------------
root=$lab_tmp/www
mkdir -p "$root/big" "$root/small" "$root/burst"
lab_log "generating the ${big_mb} MB body and ${burst} bodies of ${burst_mb} MB"
# (`|| true`: head stops reading early, and pipefail would see base64's
# SIGPIPE.)
{ head -c $((big_mb * 1000000 * 3 / 4 + 4096)) /dev/urandom | base64 -w 76 || true; } |
    head -c $((big_mb * 1000000)) >"$root/big/body.txt"
{ head -c 1024 /dev/urandom | base64 -w 64 || true; } | head -c 1024 >"$root/small/1k.txt"
head -c $((burst * burst_mb * 1000000 * 3 / 4 + 4096)) /dev/urandom | base64 -w 76 |
    split -a 3 -d -b $((burst_mb * 1000000)) - "$root/burst/f"
# No-store everywhere: (a) measures streaming, not caching; (b) caches in
# the client proxy as usual (max-age), distinct bodies so no basis helps.
NGINX_ACCESS_LOG=off lab_start_nginx "$root" '
        location /big/ { add_header Cache-Control "no-store" always; }
        location /small/ { add_header Cache-Control "no-store" always; }
        location /burst/ { add_header Cache-Control "max-age=3600" always; }'
origin_port=$lab_nginx_port

# A TLS listener answers curl only with -k (our certificate is
# self-signed), which lab_wait_http does not pass.
wait_https() {
    local url=$1 pid=$2 what=$3 deadline=$((SECONDS + 20))
    while ((SECONDS < deadline)); do
        kill -0 "$pid" 2>/dev/null || { lab_show_logs; lab_die "$what exited during start-up"; }
        curl -sk -o /dev/null --max-time 1 "$url" && return 0
        sleep 0.1
    done
    lab_show_logs
    lab_die "$what did not answer $url within 20s"
}

# nginx as a reverse proxy to the same origin, in its own process; with
# the argument h2, on a TLS listener with HTTP/2 (the certificate of (a2)).
# Sets proxy_port and proxy_pid.
start_nginx_proxy() {
    local nginx prefix conf user_line="" name=nginx-proxy listen tls=""
    nginx=$(lab_find_nginx)
    [[ ${1:-} == h2 ]] && name=nginx-proxy-h2
    prefix=$lab_tmp/$name
    mkdir -p "$prefix/temp"
    proxy_port=$(lab_free_port)
    listen="127.0.0.1:$proxy_port"
    if [[ ${1:-} == h2 ]]; then
        # nginx 1.22 syntax (`http2 on;` came in 1.25.1).
        listen="$listen ssl http2"
        tls="ssl_certificate $cert; ssl_certificate_key $key;"
    fi
    ((EUID == 0)) && user_line="user root root;"
    conf=$prefix/nginx.conf
    cat >"$conf" <<EOF
$user_line
daemon off;
master_process on;
worker_processes ${NGINX_WORKERS:-1};
pid $prefix/nginx.pid;
error_log $lab_tmp/logs/$name-error.log warn;
events { worker_connections 8192; }
worker_rlimit_nofile 20000;
http {
    access_log off;
    client_body_temp_path $prefix/temp/client_body;
    proxy_temp_path $prefix/temp/proxy;
    fastcgi_temp_path $prefix/temp/fastcgi;
    uwsgi_temp_path $prefix/temp/uwsgi;
    scgi_temp_path $prefix/temp/scgi;
    upstream origin { server 127.0.0.1:$origin_port; keepalive 64; }
    server {
        listen $listen;
        $tls
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_max_temp_file_size 0;
        }
    }
}
EOF
    "$nginx" -t -p "$prefix" -c "$conf" >"$lab_tmp/logs/$name-test.log" 2>&1 ||
        { cat "$lab_tmp/logs/$name-test.log" >&2; lab_die "nginx rejected $conf"; }
    "$nginx" -p "$prefix" -c "$conf" >>"$lab_tmp/logs/$name-error.log" 2>&1 &
    proxy_pid=$!
    lab_pids+=("$proxy_pid")
    if [[ ${1:-} == h2 ]]; then
        wait_https "https://127.0.0.1:$proxy_port/small/1k.txt" "$proxy_pid" "nginx h2 proxy"
    else
        lab_wait_http "http://127.0.0.1:$proxy_port/small/1k.txt" "$proxy_pid" "nginx proxy"
    fi
}
start_nginx_proxy
lab_start_pair
accel_port=${lab_accel_url##*:}
client_port=$lab_client_port
pids=(--pid "accelerator=$lab_accel_pid" --pid "client=$lab_client_pid" --pid "nginx=$proxy_pid")
soak() { python3 "$lab_repo/scripts/soak.py" "$@"; }

echo "rproxy soak (L-13, L-14): $(nproc) cores, $(free -m | awk '/^Mem:/ { print $2 }') MiB RAM; release binary $lab_rproxy, default flags"

# ---- (a) readers that stop reading -------------------------------------------
hsync=(--header "Accept-Encoding: hsync")
small_url=http://127.0.0.1:$origin_port/small/1k.txt
run_stall() {
    local name=$1
    shift
    lab_log "(a) $name: $slow_conns readers that stop reading"
    soak stall --conns "$slow_conns" --settle "$settle" "${pids[@]}" "$@" >"$lab_tmp/stall-$name.json" ||
        lab_die "the load generator failed on $name"
    lab_check_alive
}
stop_pid() {
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$1" 2>/dev/null || true
}
if ((run_h1)); then
    run_stall accelerator --port "$accel_port" --path /big/body.txt "${hsync[@]}" \
        --bystander-port "$accel_port" --bystander-path /small/1k.txt --bystander-header "Accept-Encoding: hsync"
    # Let the accelerator's idle timeout pass over the closed connections' work.
    sleep 2
    run_stall client --port "$client_port" --path "http://127.0.0.1:$origin_port/big/body.txt?n={i}" \
        --bystander-port "$client_port" --bystander-path "$small_url"
    sleep 2
    run_stall nginx --port "$proxy_port" --path /big/body.txt \
        --bystander-port "$proxy_port" --bystander-path /small/1k.txt
    lab_log "(a) left: $(soak mem "${pids[@]}")"
fi
# Fresh processes from here on: memory that (a) left resident (the
# allocator keeps what it freed) must not count as the next start, and
# (a)'s parked work must not compete for the two cores.
for pid in "$lab_client_pid" "$lab_accel_pid" "$proxy_pid"; do
    stop_pid "$pid"
done
lab_pids=("$lab_nginx_pid")

# ---- (a2) HTTP/2 streams with a zero window ----------------------------------
if ((run_h2)); then
    cert=$lab_tmp/tls/cert.pem
    key=$lab_tmp/tls/key.pem
    mkdir -p "$lab_tmp/tls"
    # P-256, as rcgen makes for the tests; the SAN lets curl -k and a
    # verifying client alike accept it for 127.0.0.1 and localhost.
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -days 1 \
        -keyout "$key" -out "$cert" >"$lab_tmp/logs/openssl.log" 2>&1 ||
        { cat "$lab_tmp/logs/openssl.log" >&2; lab_die "openssl could not make a certificate"; }
    chmod a+r "$key" # nginx's workers run as another user when not root
    h2_accel_port=$(lab_free_port)
    read -r -a accel_args <<<"${ACCEL_ARGS:-}"
    RUST_LOG=${RUST_LOG:-warn} "$lab_rproxy" accelerator \
        --listen "127.0.0.1:$h2_accel_port" --admin-listen 127.0.0.1:0 --origin "$lab_nginx_url" \
        --tls-cert "$cert" --tls-key "$key" "${accel_args[@]}" \
        >"$lab_tmp/logs/accelerator-h2.log" 2>&1 &
    h2_accel_pid=$!
    lab_pids+=("$h2_accel_pid")
    wait_https "https://127.0.0.1:$h2_accel_port/.rproxy/stats" "$h2_accel_pid" "rproxy accelerator (TLS)"
    start_nginx_proxy h2
    pids=(--pid "accelerator=$h2_accel_pid" --pid "nginx=$proxy_pid")
    run_h2stall() {
        local name=$1
        shift
        lab_log "(a2) $name: $slow_conns h2 streams with a zero window, $h2_streams a connection"
        soak h2stall --streams "$slow_conns" --per-conn "$h2_streams" --settle "$settle" \
            "${pids[@]}" "$@" >"$lab_tmp/h2stall-$name.json" ||
            lab_die "the h2 load generator failed on $name"
        lab_check_alive
    }
    run_h2stall accelerator --port "$h2_accel_port" --path /big/body.txt --header "accept-encoding: hsync" \
        --bystander-path /small/1k.txt --bystander-header "accept-encoding: hsync"
    sleep 2
    run_h2stall nginx --port "$proxy_port" --path /big/body.txt --bystander-path /small/1k.txt
    lab_log "(a2) left: $(soak mem "${pids[@]}")"
    for pid in "$h2_accel_pid" "$proxy_pid"; do
        stop_pid "$pid"
    done
    lab_pids=("$lab_nginx_pid")
fi

# ---- (b) burst ---------------------------------------------------------------------
if ((burst > 0)); then
    start_nginx_proxy
    lab_start_pair
    client_port=$lab_client_port
    pids=(--pid "accelerator=$lab_accel_pid" --pid "client=$lab_client_pid" --pid "nginx=$proxy_pid")
    lab_log "(b) $burst concurrent ${burst_mb} MB fetches through the pair"
    soak burst --port "$client_port" --prefix "http://127.0.0.1:$origin_port/burst/" \
        --count "$burst" --expect "$root/burst" "${pids[@]}" >"$lab_tmp/burst-pair.json" ||
        lab_die "the burst through the pair failed"
    pair_done=$SECONDS
    lab_check_alive
    lab_log "(b) $burst concurrent ${burst_mb} MB fetches through nginx proxy_pass"
    soak burst --port "$proxy_port" --prefix "/burst/" \
        --count "$burst" --expect "$root/burst" "${pids[@]}" >"$lab_tmp/burst-nginx.json" ||
        lab_die "the burst through nginx failed"
    nginx_done=$SECONDS
    sleep $((after - (SECONDS - pair_done) > 0 ? after - (SECONDS - pair_done) : 0))
    soak mem "${pids[@]}" >"$lab_tmp/after-pair.json"
    sleep $((after - (SECONDS - nginx_done) > 0 ? after - (SECONDS - nginx_done) : 0))
    soak mem "${pids[@]}" >"$lab_tmp/after-nginx.json"
    lab_check_alive
fi

# ---- report ----------------------------------------------------------------------
python3 - "$lab_tmp" "$slow_conns" "$big_mb" "$burst" "$burst_mb" "$after" "$h2_streams" <<'EOF'
import json, os, sys
tmp, conns, big_mb, burst, burst_mb, after, h2_streams = sys.argv[1], *map(int, sys.argv[2:])
load = lambda name: json.load(open(f"{tmp}/{name}.json"))
mib = lambda kib: kib / 1024
def met(ok): return "met" if ok else "NOT met"
names = {"accelerator": "accelerator", "client": "client proxy", "nginx": "nginx proxy_pass"}

has = lambda name: os.path.exists(f"{tmp}/{name}.json")

if has("stall-accelerator"):
    print(f"\n(a) L-13: {conns} readers that stop reading after the head of a {big_mb} MB body; "
          "RSS in MiB, growth = stalled - before")
    print(f"{'load on':<13} {'process':<17} {'before':>7} {'stalled':>8} {'growth':>7} "
          f"{'KiB/conn':>8} {'threads':>8} {'heads':>6}   bystander p50 / p99 ms (errors)")
    growth = {}
    for target in ["accelerator", "client", "nginx"]:
        r = load(f"stall-{target}")
        # The processes the load crosses: the pair for the client proxy.
        crossed = {"accelerator": ["accelerator"], "client": ["client", "accelerator"],
                   "nginx": ["nginx"]}[target]
        by = r["bystander"]
        for i, proc in enumerate(crossed):
            b, s = r["before"][proc], r["stalled"][proc]
            g = mib(s["rss_kib"] - b["rss_kib"])
            growth[(target, proc)] = g
            bys = (f"{by['p50_ms']:.1f} / {by['p99_ms']:.1f} ({by['errors']})  p99 {met(by['p99_ms'] <= 100)}"
                   + (f" [{by['first_error']}]" if by["errors"] else "")
                   if by["p50_ms"] is not None else f"none answered ({by['errors']}: {by['first_error']})")
            print(f"{names[target] if i == 0 else '':<13} {names[proc]:<17} {mib(b['rss_kib']):7.0f} "
                  f"{mib(s['rss_kib']):8.0f} {g:7.0f} {g * 1024 / conns:8.0f} "
                  f"{b['threads']:>3}->{s['threads']:<4} {r['heads']['ok']:>6}   "
                  + (bys if i == 0 else "") + (f"  growth {met(g <= 256)}" if proc != "nginx" else ""))
    ng = max(growth[("nginx", "nginx")], 1 / 1024)
    print(f"ratios of RSS growth to nginx proxy_pass ({ng:.0f} MiB): accelerator "
          f"{growth[('accelerator', 'accelerator')] / ng:.1f}x, client proxy {growth[('client', 'client')] / ng:.1f}x, "
          f"accelerator behind the client proxy {growth[('client', 'accelerator')] / ng:.1f}x")

def h2_rows():
    """(a2): the same columns as (a), one row per process."""
    print(f"\n(a2) L-13 over HTTP/2: {conns} streams with a zero window (SETTINGS_INITIAL_WINDOW_SIZE=0, "
          f"{h2_streams} a TLS connection) after the head of a {big_mb} MB body; RSS in MiB")
    print(f"{'load on':<13} {'process':<17} {'before':>7} {'stalled':>8} {'growth':>7} "
          f"{'KiB/strm':>8} {'threads':>8} {'heads':>6}   bystander (fresh h2 connections) p50 / p99 ms (errors)")
    growth = {}
    for target in ["accelerator", "nginx"]:
        r = load(f"h2stall-{target}")
        by, b, s = r["bystander"], r["before"][target], r["stalled"][target]
        g = mib(s["rss_kib"] - b["rss_kib"])
        growth[target] = g
        bys = (f"{by['p50_ms']:.1f} / {by['p99_ms']:.1f} ({by['errors']})  p99 {met(by['p99_ms'] <= 100)}"
               + (f" [{by['first_error']}]" if by["errors"] else "")
               if by["p50_ms"] is not None else f"none answered ({by['errors']}: {by['first_error']})")
        print(f"{('nginx proxy' if target == 'nginx' else names[target]):<13} {names[target]:<17} "
              f"{mib(b['rss_kib']):7.0f} {mib(s['rss_kib']):8.0f} "
              f"{g:7.0f} {g * 1024 / conns:8.0f} {b['threads']:>3}->{s['threads']:<4} {r['heads']['ok']:>6}   "
              + bys + (f"  growth {met(g <= 256)}" if target != "nginx" else ""))
        h2 = r["h2"]
        odd = []
        if h2["streams_opened"] != h2["streams_asked"]:
            odd.append(f"{h2['streams_opened']} of {h2['streams_asked']} streams opened "
                       f"(server's max streams {h2['server_max_streams']})")
        if set(h2["outcomes"]) - {"200"}:
            odd.append(f"stream outcomes {h2['outcomes']}"
                       + (" (\"no head\": none came while the window was 0; nginx holds HEADERS"
                          " back until DATA may follow)" if "no head" in h2["outcomes"] else ""))
        if h2["resets_after_head"]:
            odd.append(f"{h2['resets_after_head']} streams reset after their head")
        if h2["resets_late"]:
            odd.append(f"{h2['resets_late']} resets while stalled (before we closed)")
        if h2["data_bytes"]:
            odd.append(f"{h2['data_bytes']} DATA bytes despite the zero window")
        if h2["goaway"]:
            odd.append(f"GOAWAY {h2['goaway']}")
        if h2["closed_by_server"]:
            odd.append(f"{len(h2['closed_by_server'])} connections closed by the server before "
                       f"we measured ({h2['closed_by_server'][0]})")
        if odd:
            print("  " + "; ".join(odd))
    ng = max(growth["nginx"], 1 / 1024)
    print(f"ratio of RSS growth to nginx proxy_pass ({ng:.0f} MiB): accelerator "
          f"{growth['accelerator'] / ng:.1f}x")
    print("(the client proxy is not in (a2): its listener serves plain HTTP/1.1 only)")

if has("h2stall-accelerator"):
    h2_rows()

if has("burst-pair"):
    print(f"\n(b) L-14: {burst} concurrent {burst_mb} MB fetches, bodies checked; RSS in MiB "
          f"(peak = VmHWM since just before the burst, and the highest VmRSS sampled every 50 ms)")
    print(f"{'load on':<13} {'process':<17} {'before':>7} {'peak':>6} {'sampled':>8} {f'{after}s after':>9}  "
          f"{'ok/wrong/failed':>16} {'secs':>6}")
    peaks = {}
    for target, crossed in [("pair", ["client", "accelerator"]), ("nginx", ["nginx"])]:
        r, later = load(f"burst-{target}"), load(f"after-{target}")
        for i, proc in enumerate(crossed):
            b = r["before"][proc]
            peak = r["after"][proc]["hwm_kib"] if r["peak_reset"] else r["sampled_peak_kib"][proc]
            peaks[proc] = mib(peak)
            rest = mib(later[proc]["rss_kib"])
            checks = f"{r['ok']}/{r['wrong']}/{r['failed']}" if i == 0 else ""
            print(f"{('pair' if target == 'pair' else 'nginx proxy') if i == 0 else '':<13} {names[proc]:<17} "
                  f"{mib(b['rss_kib']):7.0f} {mib(peak):6.0f} {mib(r['sampled_peak_kib'][proc]):8.0f} {rest:9.0f}  "
                  f"{checks:>16} {r['seconds'] if i == 0 else 0:6.1f}"
                  + ("" if proc == "nginx" else f"  peak {met(mib(peak) <= 512)}, after: +{rest - mib(b['rss_kib']):.0f} MiB"))
        if r["first_error"]:
            print(f"  first failure: {r['first_error']}")
    np = max(peaks["nginx"], 1 / 1024)
    print(f"ratios of peak RSS to nginx proxy_pass ({np:.0f} MiB): client proxy {peaks['client'] / np:.1f}x, "
          f"accelerator {peaks['accelerator'] / np:.1f}x")
    print("(configured memory caches, counted in \"after\" once filled: the accelerator's --basis-store, 256 MiB, plus a quarter of it for bodies being collected; the client proxy's --memory-cache, 64 MiB)")
EOF
for name in accelerator client accelerator-h2; do
    [[ -f $lab_tmp/logs/$name.log ]] || continue
    n=$(grep -c -e panicked -e ' ERROR ' "$lab_tmp/logs/$name.log" || true)
    if ((n > 0)); then
        echo "$name logged $n error/panic lines, e.g.:"
        grep -m 3 -e panicked -e ' ERROR ' "$lab_tmp/logs/$name.log"
    fi
done
