#!/usr/bin/env bash
# Benchmark of the proxy pair against a local nginx origin, with the peer
# (nginx served directly) measured in the same run. A manual benchmark: CI
# does not run it.
#
#   wrk/curl ──► rproxy client ══ hsync ══► rproxy accelerator ──► nginx
#
# 1. Requests/s and p50/p99 latency for a 1 KiB file (wrk -t1 -c64 --latency):
#      direct       nginx itself (the peer)
#      pass-through /nostore/ (Cache-Control: no-store): every request
#                   crosses both proxies and reaches nginx
#      cache hit    /cached/ (max-age=3600), answered by the client proxy
#    The client proxy runs on one core (taskset -c 0; unpinned for part 2)
#    and wrk on another,
#    as target L-1 asks (>= 10k req/s, p99 <= 5 ms on one core). The direct
#    and pass-through cases run once more with one connection (-c1), for
#    target L-2 (pass-through adds <= 1 ms at p50 over direct).
# 2. MB/s for a 256 MiB body (text-like: base64 of random bytes): directly
#    from nginx, through the pair cold (curl -o /dev/null), and again as a
#    cache hit (checked with cmp).
# 3. Bytes on the hsync link for the corpus sequence: nginx serves
#    $CORPUS/public at its own versioned paths, and curl fetches, in the
#    order of the `seq` lines of $CORPUS/MANIFEST, each basis (the first
#    time it appears) and each new release through the pair, as a user
#    upgrading over time would. The client chooses its bases itself. Link
#    bytes (client stats upstream_bytes + signature_bytes) are summed
#    against gzip -9 of what curl received, for the whole sequence and for
#    the updates alone (target <= 0.35).
#
# Usage: scripts/bench-proxy.sh
#   DURATION=5       seconds per wrk case
#   CONNECTIONS=64   wrk connections for the loaded cases
#   BIG_MB=256       size of the large body (MiB; 1024 for target L-3)
#   ACCEL_ARGS=      more accelerator flags, e.g. "--no-adapt" (always entropy-code)
#   CORPUS=DIR       corpus folder (default ../shared/corpus; skipped if absent)
#   RPROXY, NGINX, CARGO_TARGET_DIR, KEEP_TMP: see scripts/lib-nginx.sh
# Needs: nginx, wrk (installed with apt-get when missing and run as root),
# curl, gzip, taskset, awk.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init bench-proxy

duration=${DURATION:-5}
connections=${CONNECTIONS:-64}
big_mb=${BIG_MB:-256}

if ! command -v wrk >/dev/null 2>&1; then
    ((EUID == 0)) || lab_die "wrk is not installed (apt-get install wrk)"
    lab_log "installing wrk"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends wrk >"$lab_tmp/logs/apt.log" 2>&1; then
        apt-get update >>"$lab_tmp/logs/apt.log" 2>&1 &&
            apt-get install -y --no-install-recommends wrk >>"$lab_tmp/logs/apt.log" 2>&1 ||
            { cat "$lab_tmp/logs/apt.log" >&2; lab_die "cannot install wrk"; }
    fi
fi
for tool in wrk gzip taskset awk; do
    command -v "$tool" >/dev/null || lab_die "$tool is not installed"
done
lab_build

# Cores: the client proxy on the first, wrk on the last (when there are two).
ncpu=$(nproc)
client_pin=(taskset -c 0)
wrk_pin=()
if ((ncpu >= 2)); then
    wrk_pin=(taskset -c $((ncpu - 1)))
fi

# ---- origin content -------------------------------------------------------
root=$lab_tmp/www
mkdir -p "$root/direct" "$root/nostore" "$root/cached" "$root/big" "$root/seq"
head -c 1024 /dev/urandom | base64 -w 64 | head -c 1024 >"$root/direct/1k.txt"
cp "$root/direct/1k.txt" "$root/nostore/1k.txt"
cp "$root/direct/1k.txt" "$root/cached/1k.txt"
lab_log "generating the ${big_mb} MiB body"
head -c $(((big_mb * 3 / 4 + 2) << 20)) /dev/urandom | base64 -w 76 >"$root/big/body.txt"
truncate -s "${big_mb}M" "$root/big/body.txt"
# Old Last-Modified: heuristically fresh, so a repeat fetch is a cache hit.
touch -d '2024-01-01 00:00:00 UTC' "$root/big/body.txt"

corpus=$(lab_corpus)
sequence=() updates=()
if [[ -n $corpus && -f $corpus/MANIFEST ]]; then
    declare -A listed=()
    while read -r kind basis new _; do
        [[ $kind == seq ]] || continue
        [[ -f $corpus/$basis && -f $corpus/$new ]] || lab_die "MANIFEST names a missing file: $basis $new"
        for file in "$basis" "$new"; do
            [[ -n ${listed[$file]:-} ]] && continue
            listed[$file]=1
            sequence+=("$file")
            [[ $file == "$new" ]] && updates+=("$file")
            mkdir -p "$root/$(dirname "$file")"
            cp "$corpus/$file" "$root/$file"
        done
    done <"$corpus/MANIFEST"
else
    lab_log "no corpus at ${CORPUS:-$lab_repo/../shared/corpus}: skipping the link-bytes part"
fi

# No access log: writing it per request would be the origin's main cost.
NGINX_ACCESS_LOG=off lab_start_nginx "$root" '
        location /nostore/ { add_header Cache-Control "no-store" always; }
        location /cached/  { add_header Cache-Control "max-age=3600" always; }'
lab_start_pair "${client_pin[@]}"
lab_log "nginx $lab_nginx_url, accelerator $lab_accel_url, client $lab_client_url (${client_pin[*]})"

# ---- helpers --------------------------------------------------------------
# wrk prints 1.23ms, 456.00us or 1.02s; all in ms.
to_ms() {
    awk -v v="$1" 'BEGIN {
        n = v + 0
        if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n *= 1; else if (v ~ /s$/) n *= 1000
        printf "%.3f", n }'
}

# run_wrk NAME CONNECTIONS URL: sets w_rps, w_p50, w_p99 (ms). A URL of
# another host than the target is sent in absolute form (forward proxy,
# as curl -x does) to TARGET.
run_wrk() {
    local name=$1 conns=$2 target=$3 url=$4 out script
    out=$lab_tmp/wrk-${name// /_}.txt
    script=$lab_tmp/wrk-path.lua
    # wrk connects to TARGET; the request line carries URL itself.
    printf 'wrk.path = "%s"\n' "$url" >"$script"
    lab_log "wrk: $name (-c$conns, ${duration}s)"
    cpu_mark
    "${wrk_pin[@]}" wrk -t1 -c"$conns" -d"${duration}s" --latency -s "$script" "$target/" >"$out" 2>&1 ||
        { cat "$out" >&2; lab_die "wrk failed for $name"; }
    lab_check_alive
    if grep -q -e 'Non-2xx' -e 'Socket errors' "$out"; then
        cat "$out" >&2
        lab_die "$name: wrk saw errors (see above)"
    fi
    w_rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
    w_p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$out")")
    w_p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$out")")
    w_requests=$(awk '/requests in/ { print $1 }' "$out")
    # CPU microseconds per request in the client proxy and the accelerator.
    read -r w_cpu_c w_cpu_a <<<"$(cpu_since)"
    w_us=$(awk -v c="$w_cpu_c" -v a="$w_cpu_a" -v n="$w_requests" 'BEGIN { printf "%.0f / %.0f", 1e6 * c / n, 1e6 * a / n }')
    [[ -n $w_rps && -n $w_p50 && -n $w_p99 ]] || { cat "$out" >&2; lab_die "cannot read wrk's output for $name"; }
}

counter() { lab_field "$(lab_stats "$1")" "$2"; }

# CPU seconds (user + system) a process has used so far.
clk_tck=$(getconf CLK_TCK)
cpu_s() {
    awk -v hz="$clk_tck" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / hz }' "/proc/$1/stat"
}
# cpu_mark: remember both proxies' CPU time; cpu_since: CPU seconds since,
# as "client accelerator".
cpu_mark() { cpu_c0=$(cpu_s "$lab_client_pid") cpu_a0=$(cpu_s "$lab_accel_pid"); }
cpu_since() {
    awk -v c0="$cpu_c0" -v a0="$cpu_a0" -v c1="$(cpu_s "$lab_client_pid")" -v a1="$(cpu_s "$lab_accel_pid")" \
        'BEGIN { printf "%.2f %.2f", c1 - c0, a1 - a0 }'
}

# Peak RSS growth (MiB) of both proxies since rss_mark, as "client accel":
# the peak (VmHWM) is reset by writing 5 to clear_refs, then compared with
# the resident size at the mark.
rss_kb() { awk -v f="$2" '$1 == f ":" { print $2 }' "/proc/$1/status"; }
rss_mark() {
    local pid
    for pid in "$lab_client_pid" "$lab_accel_pid"; do
        echo 5 >"/proc/$pid/clear_refs" 2>/dev/null || lab_log "cannot reset the peak RSS of $pid"
    done
    rss_c0=$(rss_kb "$lab_client_pid" VmRSS) rss_a0=$(rss_kb "$lab_accel_pid" VmRSS)
}
rss_growth() {
    awk -v c0="$rss_c0" -v a0="$rss_a0" -v c1="$(rss_kb "$lab_client_pid" VmHWM)" -v a1="$(rss_kb "$lab_accel_pid" VmHWM)" \
        'BEGIN { printf "%.1f %.1f", (c1 - c0) / 1024, (a1 - a0) / 1024 }'
}

# ---- 1. small requests ----------------------------------------------------
small=/1k.txt
# The client must answer /cached/ from its cache and pass /nostore/ on.
curl -sS --fail -o /dev/null -x "$lab_proxy" "$lab_nginx_url/cached$small" || lab_die "cannot fetch /cached$small through the pair"
status=$(curl -sS --fail -o /dev/null -D - -x "$lab_proxy" "$lab_nginx_url/cached$small" | tr -d '\r' | sed -n 's/^[Cc]ache-[Ss]tatus: *//p')
[[ $status == *hit* ]] || lab_die "/cached$small is not a cache hit the second time (Cache-Status: $status)"
curl -sS --fail -o "$lab_tmp/nostore.out" -x "$lab_proxy" "$lab_nginx_url/nostore$small" || lab_die "cannot fetch /nostore$small through the pair"
cmp -s "$lab_tmp/nostore.out" "$root/nostore$small" || lab_die "/nostore$small: wrong bytes through the pair"

declare -A rps p50 p99 us
run_wrk "direct" "$connections" "$lab_nginx_url" "/direct$small"
rps[direct]=$w_rps p50[direct]=$w_p50 p99[direct]=$w_p99 us[direct]=$w_us

origin_before=$(counter "$lab_accel_url" requests)
run_wrk "pass-through" "$connections" "$lab_client_url" "$lab_nginx_url/nostore$small"
rps[pass]=$w_rps p50[pass]=$w_p50 p99[pass]=$w_p99 us[pass]=$w_us
origin_seen=$(($(counter "$lab_accel_url" requests) - origin_before))
((origin_seen * 10 >= w_requests * 9)) ||
    lab_die "pass-through: wrk made $w_requests requests but only $origin_seen reached the accelerator"

hits_before=$(counter "$lab_client_url" hits)
run_wrk "cache hit" "$connections" "$lab_client_url" "$lab_nginx_url/cached$small"
rps[hit]=$w_rps p50[hit]=$w_p50 p99[hit]=$w_p99 us[hit]=$w_us
hits=$(($(counter "$lab_client_url" hits) - hits_before))
((hits * 10 >= w_requests * 9)) || lab_die "cache hit: wrk made $w_requests requests but the client counted $hits hits"

run_wrk "direct c1" 1 "$lab_nginx_url" "/direct$small"
rps[direct1]=$w_rps p50[direct1]=$w_p50 p99[direct1]=$w_p99 us[direct1]=$w_us
run_wrk "pass-through c1" 1 "$lab_client_url" "$lab_nginx_url/nostore$small"
rps[pass1]=$w_rps p50[pass1]=$w_p50 p99[pass1]=$w_p99 us[pass1]=$w_us

# ---- 2. large body --------------------------------------------------------
# The large body is about throughput of the pair, not one core: unpin the
# client proxy (all its threads) so it runs as deployed.
taskset -a -p -c "0-$((ncpu - 1))" "$lab_client_pid" >/dev/null || lab_die "cannot unpin the client proxy"
big_bytes=$(lab_size "$root/big/body.txt")
# curl_time NAME ARGS...: seconds for the whole transfer; checks the size.
curl_time() {
    local name=$1 result size
    shift
    result=$(curl -sS --fail --max-time 600 -o /dev/null -w '%{time_total} %{size_download}' "$@") ||
        { lab_check_alive; lab_die "$name: curl failed"; }
    lab_check_alive
    size=${result#* }
    ((size == big_bytes)) || lab_die "$name: $size bytes received, want $big_bytes"
    echo "${result% *}"
}
lab_log "large body: ${big_mb} MiB"
curl -sS --fail -o /dev/null "$lab_nginx_url/big/body.txt" # page cache
t_big_direct=$(curl_time "large, direct" "$lab_nginx_url/big/body.txt")
up_before=$(counter "$lab_client_url" upstream_bytes)
fail_before=$(counter "$lab_client_url" digest_failures)
stored=$(counter "$lab_client_url" stored)
cpu_mark
rss_mark
t_big_cold=$(curl_time "large, through the pair (cold)" -x "$lab_proxy" "$lab_nginx_url/big/body.txt")
lab_wait_field "$lab_client_url" stored $((stored + 1)) 30 >/dev/null
read -r big_cpu_c big_cpu_a <<<"$(cpu_since)"
read -r big_rss_c big_rss_a <<<"$(rss_growth)"
big_link=$(($(counter "$lab_client_url" upstream_bytes) - up_before))
(($(counter "$lab_client_url" digest_failures) == fail_before)) || lab_die "large body: digest failure at the client"
cpu_mark
rss_mark
t_big_hit=$(curl_time "large, cache hit" -x "$lab_proxy" "$lab_nginx_url/big/body.txt")
read -r hit_cpu_c _ <<<"$(cpu_since)"
read -r hit_rss_c _ <<<"$(rss_growth)"
# The bytes themselves, once, outside the timing.
curl -sS --fail -x "$lab_proxy" "$lab_nginx_url/big/body.txt" | cmp -s - "$root/big/body.txt" ||
    lab_die "large body: the cached copy differs from the origin's"

# ---- 3. corpus link bytes -------------------------------------------------
declare -A is_update=()
for file in "${updates[@]}"; do is_update[$file]=1; done
link_all=0 gz_all=0 raw_all=0 link_upd=0 sig_upd=0 gz_upd=0 raw_upd=0 not_delta=0
if ((${#sequence[@]} > 0)); then
    lab_log "corpus: ${#sequence[@]} fetches, ${#updates[@]} of them updates"
    for file in "${sequence[@]}"; do
        before=$(lab_stats "$lab_client_url")
        curl -sS --fail -o "$lab_tmp/corpus.out" -x "$lab_proxy" "$lab_nginx_url/$file" ||
            lab_die "corpus: cannot fetch /$file"
        cmp -s "$lab_tmp/corpus.out" "$root/$file" || lab_die "corpus: wrong bytes for /$file"
        # The client counts a transfer once it is checked and stored.
        lab_wait_field "$lab_client_url" stored $(($(lab_field "$before" stored) + 1)) >/dev/null
        after=$(lab_stats "$lab_client_url")
        up=$(($(lab_field "$after" upstream_bytes) - $(lab_field "$before" upstream_bytes)))
        sig=$(($(lab_field "$after" signature_bytes) - $(lab_field "$before" signature_bytes)))
        gz=$(gzip -9 -c "$lab_tmp/corpus.out" | wc -c | tr -d ' ')
        raw=$(lab_size "$lab_tmp/corpus.out")
        link_all=$((link_all + up + sig)) gz_all=$((gz_all + gz)) raw_all=$((raw_all + raw))
        kind=first
        if [[ -n ${is_update[$file]:-} ]]; then
            kind=update
            (($(lab_field "$after" deltas) > $(lab_field "$before" deltas))) || not_delta=$((not_delta + 1))
            link_upd=$((link_upd + up + sig)) sig_upd=$((sig_upd + sig))
            gz_upd=$((gz_upd + gz)) raw_upd=$((raw_upd + raw))
        fi
        printf '  %-6s %-46s %8d B, link %7d B (sig %5d), gzip -9 %7d B, ratio %.3f\n' \
            "$kind" "$file" "$raw" $((up + sig)) "$sig" "$gz" "$(awk -v a=$((up + sig)) -v b="$gz" 'BEGIN { print a / b }')" >&2
    done
fi
lab_check_alive
((not_delta == 0)) || lab_log "corpus: $not_delta update(s) did not come as hsync streams"

# ---- report ---------------------------------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
verdict() { if awk "BEGIN { exit !($1) }"; then echo met; else echo "NOT met"; fi; }
mbps() { awk -v b="$big_bytes" -v t="$1" 'BEGIN { printf "%.0f", b / t / 1e6 }'; }

added50=$(awk -v a="${p50[pass1]}" -v b="${p50[direct1]}" 'BEGIN { printf "%.3f", a - b }')
added50_load=$(awk -v a="${p50[pass]}" -v b="${p50[direct]}" 'BEGIN { printf "%.3f", a - b }')
l1=$(verdict "${rps[hit]} >= 10000 && ${p99[hit]} <= 5")
l2=$(verdict "$added50 <= 1")

echo
echo "rproxy bench-proxy: $(nproc) cores, ${duration}s per case, wrk -t1 --latency; client proxy ${client_pin[*]}${wrk_pin:+, wrk ${wrk_pin[*]}}"
echo
echo "1 KiB file                      | req/s    | p50 ms | p99 ms | req/s vs direct | p50 vs direct | CPU us/req client / accel | target"
echo "------------------------------- | -------- | ------ | ------ | --------------- | ------------- | ------------------------- | ------"
row() { # label key base target
    printf '%-31s | %8.0f | %6.3f | %6.3f | %-15s | %-13s | %-25s | %s\n' "$1" "${rps[$2]}" "${p50[$2]}" "${p99[$2]}" \
        "$(ratio "${rps[$2]}" "${rps[$3]}")" "$(ratio "${p50[$2]}" "${p50[$3]}")" "${us[$2]}" "$4"
}
row "direct nginx (c$connections)" direct direct "peer"
row "pass-through no-store (c$connections)" pass direct "added p50 ${added50_load} ms under load"
row "cache hit, client 1 core (c$connections)" hit direct "L-1: >= 10k req/s, p99 <= 5 ms: $l1"
row "direct nginx (c1)" direct1 direct1 "peer"
row "pass-through no-store (c1)" pass1 direct1 "L-2: added p50 <= 1 ms: +${added50} ms, $l2"
echo
l3=$(verdict "$(mbps "$t_big_cold") >= 300 && $big_rss_c <= 64 && $big_rss_a <= 64")
echo "${big_mb} MiB body (MB = 10^6 B)       | seconds | MB/s  | vs direct | CPU s client / accel | RSS growth MiB client / accel | link bytes"
echo "------------------------------- | ------- | ----- | --------- | -------------------- | ----------------------------- | ----------"
printf '%-31s | %7.2f | %5s | %-9s | %-20s | %-29s | %s\n' "direct nginx" "$t_big_direct" "$(mbps "$t_big_direct")" "1.00x" "-" "-" "-"
printf '%-31s | %7.2f | %5s | %-9s | %-20s | %-29s | %s\n' "through the pair, cold" "$t_big_cold" "$(mbps "$t_big_cold")" \
    "$(ratio "$(mbps "$t_big_cold")" "$(mbps "$t_big_direct")")" "$big_cpu_c / $big_cpu_a" "$big_rss_c / $big_rss_a" \
    "$big_link ($(ratio "$big_link" "$big_bytes") of body)"
printf '%-31s | %7.2f | %5s | %-9s | %-20s | %-29s | %s\n' "client cache hit" "$t_big_hit" "$(mbps "$t_big_hit")" \
    "$(ratio "$(mbps "$t_big_hit")" "$(mbps "$t_big_direct")")" "$hit_cpu_c / -" "$hit_rss_c / -" "0"
echo "L-3 (>= 300 MB/s, <= 64 MiB RSS growth per process, meant for BIG_MB=1024): $l3"
echo
if ((${#sequence[@]} > 0)); then
    cr_upd=$(awk -v a="$link_upd" -v b="$gz_upd" 'BEGIN { printf "%.3f", a / b }')
    cr_all=$(awk -v a="$link_all" -v b="$gz_all" 'BEGIN { printf "%.3f", a / b }')
    echo "corpus sequence                 | fetches | to curl B | gzip -9 B | hsync link B | link / gzip -9"
    echo "------------------------------- | ------- | --------- | --------- | ------------ | --------------"
    printf '%-31s | %7d | %9d | %9d | %12d | %s (target <= 0.35: %s)\n' "updates (new releases)" "${#updates[@]}" \
        "$raw_upd" "$gz_upd" "$link_upd" "$cr_upd" "$(verdict "$cr_upd <= 0.35")"
    printf '%-31s | %7d | %9d | %9d | %12d | %s\n' "whole sequence (with firsts)" "${#sequence[@]}" \
        "$raw_all" "$gz_all" "$link_all" "$cr_all"
    echo "(signatures sent with the updates: $sig_upd B)"
    ((not_delta == 0)) || echo "WARNING: $not_delta update(s) were not hsync streams"
else
    echo "corpus: skipped (no MANIFEST)"
fi
