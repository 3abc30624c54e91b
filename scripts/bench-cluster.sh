#!/usr/bin/env bash
# Bytes on the link for the corpus sequence when two accelerators share the
# load (issue 20): nginx -> two accelerators -> a round-robin balancer (per
# request, as an HTTP load balancer spreads them) -> client proxy -> curl.
# A client's next request then reaches the other accelerator half the
# time; what that one knows of the body the client holds decides the bytes.
#
# Two set-ups, each with fresh accelerators, client proxy and cache:
#   separate   each accelerator keeps its own bodies (the defaults: memory,
#              and disk for large ones, each in a directory of its own)
#   shared     the same, both also sharing them on one redis-server
#              (--basis-redis; Redis bounded by --maxmemory 256mb
#              --maxmemory-policy allkeys-lru)
#
# curl fetches, in the order of the `seq` lines of $CORPUS/MANIFEST, each
# basis (the first time it appears) and each new release, as
# bench-proxy.sh does. "Link" is what crossed between the client proxy
# and the balancer, both ways (client stats upstream_bytes +
# signature_bytes), summed over the updates (new releases). Beside it, in
# the same run: gzip -9 of each update and zstd -19 --patch-from=basis
# (the sender holding the very basis: the limit).
#
# Usage: scripts/bench-cluster.sh   (RPROXY=PATH to skip the build; CORPUS=DIR)
# Needs: nginx, redis-server, curl, gzip, zstd, python3.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init bench-cluster
for tool in curl zstd gzip python3 redis-server; do
    command -v "$tool" >/dev/null || lab_die "$tool is not installed"
done
corpus=$(lab_corpus)
[[ -n $corpus && -f $corpus/MANIFEST ]] || lab_die "no corpus at ${CORPUS:-$lab_repo/../shared/corpus}"
lab_build

root=$lab_tmp/www
mkdir -p "$root"
sequence=() updates=()
declare -A basis_of=()
declare -A listed=()
while read -r kind basis new _; do
    [[ $kind == seq ]] || continue
    [[ -f $corpus/$basis && -f $corpus/$new ]] || lab_die "MANIFEST names a missing file: $basis $new"
    basis_of[$new]=$basis
    for file in "$basis" "$new"; do
        [[ -n ${listed[$file]:-} ]] && continue
        listed[$file]=1
        sequence+=("$file")
        [[ $file == "$new" ]] && updates+=("$file")
        mkdir -p "$root/$(dirname "$file")"
        cp "$corpus/$file" "$root/$file"
    done
done <"$corpus/MANIFEST"

# The peers, once: gzip -9 and zstd --patch-from of each update.
gz_upd=0 zstd_upd=0
for file in "${updates[@]}"; do
    gz_upd=$((gz_upd + $(gzip -9 -c "$root/$file" | wc -c)))
    zstd_upd=$((zstd_upd + $(zstd -q -19 --patch-from="$root/${basis_of[$file]}" -c "$root/$file" 2>/dev/null | wc -c)))
done

NGINX_ACCESS_LOG=off lab_start_nginx "$root"

# A round-robin HTTP/1.1 balancer: each request to the next backend, on a
# kept-alive connection of its own to each; the response relayed as it
# came (status, headers, body), Content-Length set from the body read.
cat >"$lab_tmp/balancer.py" <<'PY'
import http.client, http.server, itertools, sys, threading
port, backends = int(sys.argv[1]), [b.split(':') for b in sys.argv[2:]]
turn = itertools.count()
local = threading.local()
HOP = {'connection', 'keep-alive', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'proxy-connection'}

class Relay(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *args):
        pass
    def do_GET(self):
        n = next(turn) % len(backends)
        conns = getattr(local, 'conns', None) or {}
        local.conns = conns
        for attempt in (0, 1):
            conn = conns.get(n) or http.client.HTTPConnection(*backends[n], timeout=60)
            conns[n] = conn
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in HOP:
                        conn.putheader(name, value)
                conn.endheaders()
                response = conn.getresponse()
                body = response.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                conns.pop(n, None)
                if attempt:
                    raise
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP and name.lower() != 'content-length':
                self.send_header(name, value)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.ThreadingHTTPServer(('127.0.0.1', port), Relay).serve_forever()
PY

# setup NAME [ACCEL FLAGS...]: two accelerators with those flags, the
# balancer and a client proxy in front; then the sequence. Prints the
# updates' link bytes and the hash-only share to $lab_tmp/NAME.result.
setup() {
    local name=$1 a b balancer_port client_port i pids=()
    shift
    local accel_urls=()
    for i in 1 2; do
        local port
        port=$(lab_free_port)
        mkdir -p "$lab_tmp/$name/spool$i"
        RUST_LOG=${RUST_LOG:-warn} "$lab_rproxy" accelerator --listen "127.0.0.1:$port" --admin-listen off \
            --origin "$lab_nginx_url" --spool-dir "$lab_tmp/$name/spool$i" "$@" \
            >"$lab_tmp/logs/$name-accelerator$i.log" 2>&1 &
        pids+=($!)
        lab_pids+=($!)
        lab_wait_http "http://127.0.0.1:$port/.rproxy/stats" "$!" "accelerator $i ($name)"
        accel_urls+=("127.0.0.1:$port")
    done
    balancer_port=$(lab_free_port)
    python3 "$lab_tmp/balancer.py" "$balancer_port" "${accel_urls[@]}" >"$lab_tmp/logs/$name-balancer.log" 2>&1 &
    pids+=($!)
    lab_pids+=($!)
    lab_wait_http "http://127.0.0.1:$balancer_port/.rproxy/stats" "$!" "balancer ($name)"
    client_port=$(lab_free_port)
    mkdir -p "$lab_tmp/$name/cache"
    RUST_LOG=${RUST_LOG:-warn} "$lab_rproxy" client --listen "127.0.0.1:$client_port" --admin-listen off \
        --upstream "http://127.0.0.1:$balancer_port" --cache "$lab_tmp/$name/cache" \
        >"$lab_tmp/logs/$name-client.log" 2>&1 &
    pids+=($!)
    lab_pids+=($!)
    local client=http://127.0.0.1:$client_port
    lab_wait_http "$client/.rproxy/stats" "$!" "client proxy ($name)"

    declare -A is_update=()
    local file before after up sig link_upd=0 sig_upd=0 link_all=0
    for file in "${updates[@]}"; do is_update[$file]=1; done
    for file in "${sequence[@]}"; do
        before=$(lab_stats "$client")
        curl -sS --fail -o "$lab_tmp/got" -x "$client" "$lab_nginx_url/$file" || lab_die "$name: cannot fetch /$file"
        cmp -s "$lab_tmp/got" "$root/$file" || lab_die "$name: wrong bytes for /$file"
        lab_wait_field "$client" stored $(($(lab_field "$before" stored) + 1)) >/dev/null
        after=$(lab_stats "$client")
        up=$(($(lab_field "$after" upstream_bytes) - $(lab_field "$before" upstream_bytes)))
        sig=$(($(lab_field "$after" signature_bytes) - $(lab_field "$before" signature_bytes)))
        link_all=$((link_all + up + sig))
        if [[ -n ${is_update[$file]:-} ]]; then
            link_upd=$((link_upd + up + sig)) sig_upd=$((sig_upd + sig))
        fi
    done
    echo "$link_upd $sig_upd $link_all" >"$lab_tmp/$name.result"
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
}

redis_port=$(lab_free_port)
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
    --maxmemory 256mb --maxmemory-policy allkeys-lru >"$lab_tmp/logs/redis.log" 2>&1 &
redis_pid=$!
lab_pids+=("$redis_pid")
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null && break
    sleep 0.1
done

lab_log "corpus: ${#sequence[@]} fetches, ${#updates[@]} of them updates"
setup separate
setup shared --basis-redis "redis://127.0.0.1:$redis_port"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'; }
echo
echo "rproxy bench-cluster: two accelerators behind a round-robin balancer, ${#updates[@]} updates of the corpus sequence"
echo "(gzip -9 of the updates: $gz_upd B; zstd -19 --patch-from: $zstd_upd B)"
echo
echo "set-up                          | updates link B | of which signatures | link / gzip -9 | link / zstd --patch-from | whole sequence link B"
echo "------------------------------- | -------------- | ------------------- | -------------- | ------------------------ | ---------------------"
for name in separate shared; do
    read -r link sig all <"$lab_tmp/$name.result"
    printf '%-31s | %14d | %19d | %14s | %24s | %21d\n' "$name" "$link" "$sig" \
        "$(ratio "$link" "$gz_upd")" "$(ratio "$link" "$zstd_upd")" "$all"
done
printf '%-31s | %14d | %19s | %14s | %24s | %21s\n' "zstd -19 --patch-from (limit)" "$zstd_upd" "-" \
    "$(ratio "$zstd_upd" "$gz_upd")" "1.000" "-"
