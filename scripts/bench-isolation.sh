#!/usr/bin/env bash
# D-S6 (CPU isolation) for the accelerator: the latency of a cheap request
# (GET /.rproxy/stats on a kept-alive connection, every 5 ms) while idle and
# while ENCODES large bodies are coded from scratch at once, with the
# accelerator's default --max-encoders (one per core) and, as the peer in
# the same run, with --max-encoders 64 (every encoder runs at once, as
# before encoders took turns). A manual benchmark: CI does not run it.
#
#   curl x ENCODES ──► rproxy accelerator ──► nginx
#   probe (python) ──► GET /.rproxy/stats
#
# Usage: scripts/bench-isolation.sh
#   ENCODES=8      large bodies coded at once
#   BODY_MB=256    their size (MiB of base64 text)
#   RPROXY, NGINX, CARGO_TARGET_DIR, KEEP_TMP: see scripts/lib-nginx.sh
# Needs: nginx, curl, python3.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init bench-isolation
lab_find_nginx
lab_build
encodes=${ENCODES:-8}
body_mb=${BODY_MB:-256}

root=$lab_tmp/www
mkdir -p "$root/big"
lab_log "generating the ${body_mb} MiB body"
head -c $(((body_mb * 3 / 4 + 2) << 20)) /dev/urandom | base64 -w 76 >"$root/big/body.txt"
truncate -s "${body_mb}M" "$root/big/body.txt"
NGINX_ACCESS_LOG=off lab_start_nginx "$root" ''

cat >"$lab_tmp/probe.py" <<'PY'
import http.client, sys, time, urllib.parse
url = urllib.parse.urlparse(sys.argv[1])
conn = http.client.HTTPConnection(url.hostname, url.port)
ms = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    conn.request("GET", "/.rproxy/stats")
    conn.getresponse().read()
    ms.append((time.perf_counter() - t) * 1000)
    time.sleep(0.005)
ms.sort()
print("%.2f %.2f %.2f" % (ms[len(ms) // 2], ms[int(len(ms) * 0.99)], ms[-1]))
PY

# run LABEL ACCELERATOR-FLAGS...: prints one table row.
run() {
    local label=$1 pids=() idle busy i
    shift
    ACCEL_ARGS="$*" lab_start_pair
    idle=$(python3 "$lab_tmp/probe.py" "$lab_accel_url" 200)
    for ((i = 0; i < encodes; i++)); do
        curl -sS -o /dev/null -H 'Accept-Encoding: hsync' "$lab_accel_url/big/body.txt" &
        pids+=($!)
    done
    sleep 1
    busy=$(python3 "$lab_tmp/probe.py" "$lab_accel_url" 400)
    wait "${pids[@]}"
    waits=$(lab_field "$(lab_stats "$lab_accel_url")" encoder_waits)
    read -r i50 i99 imax <<<"$idle"
    read -r b50 b99 bmax <<<"$busy"
    printf '%-28s | %5s / %5s / %5s | %5s / %6s / %6s | %s\n' "$label" "$i50" "$i99" "$imax" "$b50" "$b99" "$bmax" "$waits"
    kill "$lab_client_pid" "$lab_accel_pid"
    wait "$lab_client_pid" "$lab_accel_pid" 2>/dev/null || true
}

echo
echo "rproxy bench-isolation: $(nproc) cores, $encodes x ${body_mb} MiB coded at once"
echo
echo "accelerator                  | idle p50/p99/max ms   | busy p50/p99/max ms    | encoder waits"
echo "---------------------------- | --------------------- | ---------------------- | -------------"
run "--max-encoders 0 (cores)"
run "--max-encoders 64 (peer)" --max-encoders 64
echo "(D-S6 target: busy p99 <= 10 ms)"
