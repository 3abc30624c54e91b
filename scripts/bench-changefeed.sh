#!/usr/bin/env bash
# The change feed (issue 22) over the corpus's release chains: what
# prefetching each update through the feed costs on the link, against
# fetching the same update on demand, and how long a submission takes to
# make every cache fresh. Two topologies, started in the same run against
# the same nginx:
#
#   (a) on demand:  nginx ──► accelerator ──► byte-relay.py ──► client ──► curl
#   (b) feed:       nginx ──► accelerator ──► byte-relay.py ──► client A ──► client B ──► curl
#                             --feed-state                      --subscribe   --subscribe
#                                                               (pushed)      (pushed by A)
#
# The `seq` lines of $CORPUS/MANIFEST form chains, as in
# scripts/bench-corpus-pair.sh (bootstrap.css 5.2.0 → 5.2.3 → … → 5.3.3,
# jquery.js 3.5.0 → … → 3.7.1, …). Each chain is ONE file, PACKAGE/FILE,
# served by one nginx at two URLs that differ only in the cache headers:
# /on-demand/PACKAGE/FILE with `Cache-Control: no-cache` (every fetch goes
# upstream, as in bench-corpus-pair.sh) and /feed/PACKAGE/FILE with
# `Cache-Control: max-age=3600` (a stored body is fresh for an hour: only
# the feed brings a change before then). The zone (b) subscribes to is
# http://127.0.0.1:NGINXPORT/feed/.
#
# Step k (0, 1, …, the longest chain's length - 1) puts release k of every
# chain that has one in place (copied over the served file with an mtime a
# minute later than the last, so a new Last-Modified and ETag), then:
#   (a) fetches each changed URL through the client proxy (`curl -x`), one
#       at a time, as bench-corpus-pair.sh does: the client revalidates,
#       nginx answers 200 with the new release, the accelerator codes it
#       against the body it served last time (kept: basis store defaults);
#   (b) at step 0, fetches each URL through B (so A and B both hold it: the
#       feed prefetches only paths a client holds, `prefetch = "held"`) and
#       waits until A and B have replicated the accelerator's log. At step
#       k > 0: POSTs ONE submission listing every changed path straight to
#       the accelerator (`Host:` the origin's; a deploy hook's call), which
#       fetches each from nginx and commits it under the site's next CSN
#       and pushes a FEED line to A's --queue-callback listener; A pulls at
#       once and prefetches each body (a delta against what it holds, over
#       the relay; one at a time, paced at --prefetch-rate, 1M bytes/s by
#       default) then takes the CSN and pushes B in turn (B pulled it with
#       its own callback address; not with B_CALLBACK=0), which pulls A (at
#       the latest after INTERVAL) and prefetches from A. The script
#       polls A's and B's /.rproxy/stats until both zones' `csn` reach the
#       highest CSN the POST answered. Then a user fetches each changed URL
#       through B and through A: the body must equal the release (cmp), its
#       Cache-Status must say `hit`, and neither A's nor B's
#       `upstream_bytes` may move during those fetches.
# The script fails (lab_die) when a body differs, a fetch after the feed is
# not a hit or moved upstream_bytes, a submitted path is not `committed`,
# or the wait exceeds FRESH_LIMIT (30 s).
#
# What is counted (updates only: a chain's release 0 is fetched cold in
# both topologies and not counted):
#   - on-demand link: for each update, the bytes the relay between the
#     client proxy and the accelerator carried both ways while the user's
#     fetch ran, as TCP payload (heads, hash-only request or signature,
#     hsync stream, chunked framing; not TCP/IP headers, no TLS);
#   - feed link: the bytes the relay between A and the accelerator carried
#     both ways over the WHOLE step, from just before the POST to the end of
#     the users' fetches after it: A's prefetch requests and coded answers
#     AND A's feed pulls in that span (the pushed one and any at its
#     INTERVAL); the users' fetches take nothing from upstream (checked
#     by A's and B's counters). Not on the link, so not counted: the POST
#     (sent to the accelerator by the deploy side), the pushed
#     `FEED token csn` line (about 30 B, from the accelerator to A's
#     callback port), and the B ← A hop (printed apart). A's pulls between
#     steps (one per INTERVAL, zone unchanged) are not in the steps'
#     figures either: the script measures such idle pulls at the end and
#     prints what one costs;
#   - stream+sig: a client's own counters, the body as it came coded
#     (`upstream_bytes`) plus basis signatures sent up (`signature_bytes`),
#     no heads: on demand per fetch; for the feed per step, at A (what
#     crossed the relay) and at B (what came from A). The relay cannot
#     split a step's feed link by chain (one submission, the prefetches
#     share A's upstream connections), so per URL the feed has `feed str`:
#     the coded answer the feed accelerator sent A for it (its access log's
#     to_downstream; no signature was sent up when a step's A s+s equals
#     their sum). Per chain the two are compared by stream, per step and
#     in total by link as well. Beside them the zones' own counters
#     (`prefetched`, `prefetch_bytes`), and in the note column A's log line
#     `change feed: prefetched ... link_bytes=N` where it differs from the
#     accelerator's figure (the script turns those info lines on).
#   - peers, measured in the same run over the same updates, as
#     bench-corpus-pair.sh: gzip -9 -n of the new release, and zstd -19
#     --patch-from=PREVIOUS NEW (the practical limit).
#   - submit → fresh: from just before the POST (bash $EPOCHREALTIME) to the
#     first poll of /.rproxy/stats that finds the zone's csn at the step's
#     highest committed CSN, for A and for B; "fresh everywhere" is B's
#     (the later). The POST's own time (the accelerator fetches each path
#     from nginx before it answers) is in it. A round of polls (a stats
#     read of each proxy still waiting, then 10 ms of sleep) is the
#     resolution: a few tens of ms. Min, median and max over the steps
#     with a submission (1 to the longest chain's length - 1).
#
# Usage: scripts/bench-changefeed.sh
#   CORPUS=DIR        corpus folder (default ../shared/corpus from the repo root)
#   INTERVAL=1s       --subscribe-interval of A and B
#   B_CALLBACK=0      B without --queue-callback: A cannot push it, B pulls A
#                     every INTERVAL only (as before replicas pushed down
#                     the tree)
#   FRESH_LIMIT=30    seconds a step may take to be fresh everywhere
#   IDLE=3            seconds the closing idle-pull measurement watches A
#   RPROXY, NGINX, CARGO_TARGET_DIR, KEEP_TMP, ACCEL_ARGS, CLIENT_ARGS:
#                     see scripts/lib-nginx.sh (ACCEL_ARGS go to both
#                     accelerators, CLIENT_ARGS to all three client proxies)
# Needs: nginx, curl, cmp, gzip, zstd, python3; cargo unless RPROXY is given.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init bench-changefeed
for tool in gzip zstd python3; do
    command -v "$tool" >/dev/null || lab_die "$tool is not installed"
done
interval=${INTERVAL:-1s}
fresh_limit=${FRESH_LIMIT:-30}
idle=${IDLE:-3}
corpus=$(lab_corpus)
[[ -n $corpus && -f $corpus/MANIFEST ]] || lab_die "no MANIFEST in corpus folder '${CORPUS:-$lab_repo/../shared/corpus}' (set CORPUS=...)"

# The release chains of the corpus's MANIFEST (lab_corpus_chains).
lab_corpus_chains "$corpus"

# public/PACKAGE/VERSION/FILE -> PACKAGE/FILE: one file per chain.
chain_file() {
    local path=${1#public/} file pkg
    file=${path##*/}
    pkg=${path%%/*}
    echo "$pkg/$file"
}
declare -A file_seen=()
steps=0
for chain in "${chains[@]}"; do
    read -r -a releases <<<"$chain"
    file=$(chain_file "${releases[0]}")
    [[ ! -v file_seen[$file] ]] || lab_die "two chains would share the file $file"
    file_seen[$file]=1
    ((${#releases[@]} <= steps)) || steps=${#releases[@]}
done

lab_build
root=$lab_tmp/www
mkdir -p "$root"
lab_start_nginx "$root" "        location /on-demand/ {
            alias $root/;
            add_header Cache-Control \"no-cache\" always;
        }
        location /feed/ {
            alias $root/;
            add_header Cache-Control \"max-age=3600\" always;
        }"
origin=$lab_nginx_url
origin_host=${origin#http://}
zone=$origin/feed/

# (a) on demand, with the library's single pair.
lab_start_accelerator
lab_start_relay "$lab_accel_url"
od_relay=$lab_relay_stats_url
lab_start_client "$lab_relay_url"
od_client=$lab_client_url

# (b) the feed. lab_start_accelerator and lab_start_client keep one of each
# per lab (one spool, one cache directory, one log name), so these three
# are started here, each with its own.
# start_node NAME ROLE FLAGS...: `rproxy ROLE FLAGS` (then ACCEL_ARGS or
# CLIENT_ARGS) on a free loopback port, its log in logs/NAME.log; sets
# node_url. The feed's info lines are on: A's `change feed: prefetched`
# lines are where the per-URL stream+sig of the feed comes from.
start_node() {
    local name=$1 role=$2 port pid extra=()
    shift 2
    if [[ $role == accelerator ]]; then
        read -r -a extra <<<"${ACCEL_ARGS:-}"
    else
        read -r -a extra <<<"${CLIENT_ARGS:-}"
    fi
    port=$(lab_free_port)
    node_url=http://127.0.0.1:$port
    RUST_LOG="${RUST_LOG:-warn},rproxy::client_proxy::replica=info,rproxy::feed=info" \
        "$lab_rproxy" "$role" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 \
        "$@" "${extra[@]}" >"$lab_tmp/logs/$name.log" 2>&1 &
    pid=$!
    lab_pids+=("$pid")
    lab_proc_names[$pid]="rproxy $role $name"
    lab_wait_http "$node_url/.rproxy/stats" "$pid" "rproxy $role $name"
}
mkdir -p "$lab_tmp/spool-feed" "$lab_tmp/cache-a" "$lab_tmp/cache-b"
start_node feed-accelerator accelerator --origin "$origin" \
    --spool-dir "$lab_tmp/spool-feed" --feed-state "$lab_tmp/feed-state"
fd_accel=$node_url
lab_start_relay "$fd_accel"
fd_relay=$lab_relay_stats_url
subscribe=(--subscribe "$zone" --subscribe-interval "$interval")
pushed=(--queue-callback 127.0.0.1:0)
b_pushed=("${pushed[@]}")
[[ ${B_CALLBACK:-1} != 0 ]] || b_pushed=()
start_node client-a client --upstream "$lab_relay_url" --cache "$lab_tmp/cache-a" \
    --cache-size "${CACHE_SIZE:-2G}" "${subscribe[@]}" "${pushed[@]}"
fd_a=$node_url
start_node client-b client --upstream "$fd_a" --cache "$lab_tmp/cache-b" \
    --cache-size "${CACHE_SIZE:-2G}" "${subscribe[@]}" "${b_pushed[@]}"
fd_b=$node_url

# delta BEFORE AFTER NAME: how far counter NAME moved between two stats.
delta() { echo $(($(lab_field "$2" "$3") - $(lab_field "$1" "$3"))); }
# zone_field STATS NAME: a counter of the (only) zone in a client's stats.
zone_field() {
    [[ $1 == *'"feed":'* ]] || lab_die "stats have no feed: $1"
    lab_field "${1#*\"feed\":}" "$2"
}
# Microseconds since the epoch.
now_us() {
    local t=$EPOCHREALTIME
    t=${t//[.,]/}
    echo $((10#$t))
}
cache_status() { tr -d '\r' <"$1" | sed -n 's/^[Cc]ache-[Ss]tatus: *//p' | head -n 1; }
# get PROXY URL: fetches URL through PROXY into $lab_tmp/got, head in $lab_tmp/head.
get() {
    curl -sS --fail --max-time 30 -x "$1" -D "$lab_tmp/head" -o "$lab_tmp/got" "$2" ||
        lab_die "curl -x $1 $2 failed"
}
# prefetched_since LOG N: the prefetches a client logged after line N of
# its log, "URL LINK_BYTES" per line.
prefetched_since() {
    tail -n "+$(($2 + 1))" "$1" | sed -n 's/.*change feed: prefetched.*url=\("\{0,1\}\)\([^" ]*\)\1 .*link_bytes=\([0-9]*\).*/\2 \3/p'
}
# served_since LOG N: the GETs an accelerator's access log has after line
# N, "URL TO_DOWNSTREAM" per line.
served_since() {
    tail -n "+$(($2 + 1))" "$1" | sed -n 's/^time=.* method=GET url=\([^ ]*\) status=[0-9]* .* to_downstream=\([0-9]*\) .*/\1 \2/p'
}
# The site's feed as the accelerator answers a pull of the zone: its csn.
accel_csn() {
    local answer
    answer=$(curl -sS --fail --max-time 5 -H "Host: $origin_host" \
        "$fd_accel/.well-known/hsync-feed?since=0&prefix=/feed/") || lab_die "cannot pull the feed from the accelerator"
    python3 -c 'import json, sys; print(json.load(sys.stdin)["csn"])' <<<"$answer"
}
# wait_fresh CSN T0: polls A's and B's zones until both reach CSN; sets
# took_a and took_b (microseconds since T0, the first poll that found it).
wait_fresh() {
    local want=$1 t0=$2 now csn_a csn_b
    took_a="" took_b=""
    while :; do
        now=$(now_us)
        if [[ -z $took_a ]]; then
            csn_a=$(zone_field "$(lab_stats "$fd_a")" csn)
            ((csn_a < want)) || took_a=$((now - t0))
        fi
        if [[ -z $took_b ]]; then
            csn_b=$(zone_field "$(lab_stats "$fd_b")" csn)
            ((csn_b < want)) || took_b=$((now - t0))
        fi
        [[ -z $took_a || -z $took_b ]] || return 0
        if ((now - t0 > fresh_limit * 1000000)); then
            lab_show_logs
            lab_die "not fresh everywhere within ${fresh_limit}s of the submission: want csn $want, A at ${csn_a:-?}, B at ${csn_b:-?}"
        fi
        sleep 0.01
    done
}

mtime=1704067200
results=$lab_tmp/results
steplog=$lab_tmp/steps
: >"$results"
: >"$steplog"
flagged=0

for ((k = 0; k < steps; k++)); do
    # This step's chains: those with a release k.
    srcs=() prevs=() files=()
    for chain in "${chains[@]}"; do
        read -r -a releases <<<"$chain"
        ((${#releases[@]} > k)) || continue
        file=$(chain_file "${releases[0]}")
        files+=("$file")
        srcs+=("${releases[k]}")
        if ((k > 0)); then prevs+=("${releases[k - 1]}"); else prevs+=(""); fi
        served=$root/$file
        mkdir -p "${served%/*}"
        cp "$corpus/${releases[k]}" "$served.tmp"
        mtime=$((mtime + 60))
        touch -d "@$mtime" "$served.tmp"
        mv -f "$served.tmp" "$served"
    done
    n=${#files[@]}
    lab_check_alive

    # (a) on demand: each URL in turn, its link bytes alone.
    od=()
    for ((i = 0; i < n; i++)); do
        url=/on-demand/${files[i]}
        src=$corpus/${srcs[i]}
        c0=$(lab_stats "$od_client")
        r0=$(lab_stats "$od_relay")
        get "$od_client" "$origin$url"
        cmp -s "$lab_tmp/got" "$src" || lab_die "$url: the body curl got is not ${srcs[i]} byte for byte"
        # Committed just after the body's last byte: by then every byte of
        # the exchange has crossed the relay.
        lab_wait_field "$od_client" stored $(($(lab_field "$c0" stored) + 1)) 10 >/dev/null
        c1=$(lab_stats "$od_client")
        r1=$(lab_stats "$od_relay")
        note=""
        (($(delta "$c0" "$c1" hits) == 0)) || note+="od-HIT,"
        if ((k > 0)); then
            (($(delta "$c0" "$c1" deltas) == 1)) || note+="od-NOT-CODED,"
            (($(delta "$c0" "$c1" basis_same_url) == 1)) || note+="od-basis-not-same-url,"
        fi
        od[i]="$(delta "$r0" "$r1" up) $(delta "$r0" "$r1" down) $(delta "$c0" "$c1" upstream_bytes) $(delta "$c0" "$c1" signature_bytes) $note"
    done

    # (b) the feed.
    a_log_lines=$(wc -l <"$lab_tmp/logs/client-a.log")
    accel_log_lines=$(wc -l <"$lab_tmp/logs/feed-accelerator.log")
    declare -A feed_bytes=() a_logged=()
    if ((k == 0)); then
        # Users fetch release 0 through B: B and A hold every path.
        for ((i = 0; i < n; i++)); do
            get "$fd_b" "$origin/feed/${files[i]}"
            cmp -s "$lab_tmp/got" "$corpus/${srcs[i]}" || lab_die "/feed/${files[i]}: the body through B is not ${srcs[i]} byte for byte"
        done
        want=$(accel_csn)
        wait_fresh "$want" "$(now_us)"
        lab_log "step 0: $n paths fetched through B; A and B replicated the accelerator's log to csn $want"
    else
        submission=$(printf '/feed/%s\n' "${files[@]}")
        r0=$(lab_stats "$fd_relay")
        a0=$(lab_stats "$fd_a")
        b0=$(lab_stats "$fd_b")
        t0=$(now_us)
        answer=$(curl -sS --fail --max-time 30 -X POST --data-binary "$submission" \
            -H "Host: $origin_host" "$fd_accel/.well-known/hsync-feed") || lab_die "the submission failed"
        committed=$(grep -o '"result":"committed"' <<<"$answer" | wc -l | tr -d ' ')
        ((committed == n)) || lab_die "step $k: $committed of $n submitted paths committed: $answer"
        want=$(grep -o '"csn":[0-9]*' <<<"$answer" | cut -d: -f2 | sort -n | tail -n 1)
        first=$(grep -o '"csn":[0-9]*' <<<"$answer" | cut -d: -f2 | sort -n | head -n 1)
        wait_fresh "$want" "$t0"
        a1=$(lab_stats "$fd_a")
        b1=$(lab_stats "$fd_b")
        # Users, B then A: fresh hits, nothing from upstream.
        for proxy in "$fd_b" "$fd_a"; do
            for ((i = 0; i < n; i++)); do
                url=/feed/${files[i]}
                get "$proxy" "$origin$url"
                if ! cmp -s "$lab_tmp/got" "$corpus/${srcs[i]}"; then
                    was="not the previous release either"
                    ! cmp -s "$lab_tmp/got" "$corpus/${prevs[i]}" || was="it is the previous release, ${prevs[i]}"
                    lab_die "$url through $proxy after the feed: not ${srcs[i]} byte for byte ($was; Cache-Status: $(cache_status "$lab_tmp/head"))"
                fi
                cs=$(cache_status "$lab_tmp/head")
                [[ $cs == "rproxy; hit"* ]] || lab_die "$url through $proxy after the feed: not a hit (Cache-Status: ${cs:-none})"
            done
        done
        a2=$(lab_stats "$fd_a")
        b2=$(lab_stats "$fd_b")
        r2=$(lab_stats "$fd_relay")
        for name in upstream_bytes signature_bytes; do
            (($(delta "$a1" "$a2" "$name") == 0)) || lab_die "step $k: A's $name moved by $(delta "$a1" "$a2" "$name") during the users' fetches"
            (($(delta "$b1" "$b2" "$name") == 0)) || lab_die "step $k: B's $name moved by $(delta "$b1" "$b2" "$name") during the users' fetches"
        done
        # Per URL: the coded answers the accelerator sent A (its access
        # log), and what A logged for each prefetch.
        while read -r u b; do
            [[ $u == "$origin/feed/"* ]] || continue
            feed_bytes[${u#"$origin"}]=$((${feed_bytes[${u#"$origin"}]:-0} + b))
        done < <(served_since "$lab_tmp/logs/feed-accelerator.log" "$accel_log_lines")
        while read -r u b; do
            [[ -n ${u:-} ]] || continue
            a_logged[${u#"$origin"}]=$((${a_logged[${u#"$origin"}]:-0} + b))
        done < <(prefetched_since "$lab_tmp/logs/client-a.log" "$a_log_lines")
        ((${#feed_bytes[@]} > 0)) || lab_die "step $k: no GET of the zone in the feed accelerator's access log (is it off in ACCEL_ARGS?)"
        # step paths first-csn last-csn up down A-pulls
        # A-stream+sig A-prefetched A-prefetch_bytes B-stream+sig B-prefetched B-prefetch_bytes
        # ms-to-A ms-to-B
        echo "$k $n $first $want $(delta "$r0" "$r2" up) $(delta "$r0" "$r2" down)" \
            "$(($(zone_field "$a2" pulls) - $(zone_field "$a0" pulls)))" \
            "$(($(delta "$a0" "$a2" upstream_bytes) + $(delta "$a0" "$a2" signature_bytes)))" \
            "$(($(zone_field "$a2" prefetched) - $(zone_field "$a0" prefetched)))" \
            "$(($(zone_field "$a2" prefetch_bytes) - $(zone_field "$a0" prefetch_bytes)))" \
            "$(($(delta "$b0" "$b2" upstream_bytes) + $(delta "$b0" "$b2" signature_bytes)))" \
            "$(($(zone_field "$b2" prefetched) - $(zone_field "$b0" prefetched)))" \
            "$(($(zone_field "$b2" prefetch_bytes) - $(zone_field "$b0" prefetch_bytes)))" \
            "$((took_a / 1000)).$(printf %03d $((took_a % 1000)))" \
            "$((took_b / 1000)).$(printf %03d $((took_b % 1000)))" >>"$steplog"
    fi

    for ((i = 0; i < n; i++)); do
        src=$corpus/${srcs[i]}
        read -r up down stream sig note <<<"${od[i]}"
        size=$(lab_size "$src")
        gz=$(gzip -9 -n -c "$src" | wc -c | tr -d ' ')
        if ((k > 0)); then
            zp=$(zstd -qq -19 -c --patch-from="$corpus/${prevs[i]}" "$src" | wc -c | tr -d ' ')
            fb=${feed_bytes[/feed/${files[i]}]:-}
            [[ -n $fb ]] || note+="not-prefetched,"
            [[ -z $note ]] || flagged=$((flagged + 1))
            # A's own figure for the prefetch, where it is not the
            # accelerator's (not a flag: the feed's counter, see the header).
            logged=${a_logged[/feed/${files[i]}]:-none}
            [[ $logged == "${fb:-0}" ]] || note+="A-logged:$logged,"
        else
            zp=- fb=-
        fi
        note=${note%,}
        # step file release size od-up od-down od-stream od-sig feed-stream gzip zstd-patch note
        echo "$k ${files[i]} ${srcs[i]} $size $up $down $stream $sig ${fb:-0} $gz $zp ${note:--}" >>"$results"
    done
    unset feed_bytes a_logged
done

# A's pulls while nothing changes: what one costs on the link.
r0=$(lab_stats "$fd_relay")
a0=$(lab_stats "$fd_a")
sleep "$idle"
r1=$(lab_stats "$fd_relay")
a1=$(lab_stats "$fd_a")
idle_pulls=$(($(zone_field "$a1" pulls) - $(zone_field "$a0" pulls)))
idle_link=$(($(delta "$r0" "$r1" up) + $(delta "$r0" "$r1" down)))
idle_moved=$(($(delta "$a0" "$a1" upstream_bytes) + $(delta "$a0" "$a1" signature_bytes)))
lab_check_alive
final_a=$(lab_stats "$fd_a")
final_b=$(lab_stats "$fd_b")
zone_line() {
    local f out=""
    for f in csn entries pushed pulls pull_failures resets updates prefetched prefetch_bytes held_already not_held; do
        # (`pushed` is newer than the feed itself: absent, it is left out.)
        [[ $1 == *"\"$f\":"* ]] || continue
        out+="$f=$(zone_field "$1" "$f") "
    done
    echo "${out% }"
}

awk -v corpus="$corpus" -v interval="$interval" -v steplog="$steplog" -v b_pushed="${#b_pushed[@]}" \
    -v idle_pulls="$idle_pulls" -v idle_link="$idle_link" -v idle_s="$idle" -v idle_moved="$idle_moved" \
    -v zone_a="$(zone_line "$final_a")" -v zone_b="$(zone_line "$final_b")" '
function ver(p,   n, a) { n = split(p, a, "/"); return a[n - 1] }
function r(a, b) { return b > 0 ? sprintf("%.3fx", a / b) : "n/a" }
function sort(v, n,   i, j, t) {
    for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
}
function median(v, n) { return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
BEGIN {
    printf "corpus: %s\n", corpus
    printf "(a) on demand: nginx (no-cache) -> accelerator -> relay -> client proxy -> curl, one fetch per update\n"
    printf "(b) feed: nginx (max-age=3600) -> accelerator --feed-state -> relay -> client A -> client B -> curl;\n"
    printf "    A and B --subscribe the zone (--subscribe-interval %s; --queue-callback: the accelerator pushes A, %s)\n", interval, b_pushed ? "A pushes B" : "B_CALLBACK=0: B only pulls"
    printf "od link = relay bytes up + down of the user'"'"'s fetch; od s+s = the client'"'"'s upstream_bytes + signature_bytes;\n"
    printf "feed stream = the coded answer to A'"'"'s prefetch (feed accelerator'"'"'s access log, to_downstream)\n\n"
    fmt = "%-28s %-8s %8s %6s %8s %8s %8s %8s %8s %8s %8s  %s\n"
    printf fmt, "file", "release", "new", "od up", "od down", "od link", "od s+s", "feed str", "feed/od", "gzip9", "zstd-pat", "note"
}
{
    f = $2; v = ver($3)
    lastver[f] = v
    if (!(f in firstver)) { firstver[f] = v; order[++nf] = f }
    note = $12 == "-" ? "" : $12
    if ($1 == 0) {
        printf fmt, f, v, $4, $5, $6, $5 + $6, $7 + $8, "first", "(not", "counted)", "", note
        next
    }
    ods = $7 + $8
    printf fmt, f, v, $4, $5, $6, $5 + $6, ods, $9, r($9, ods), $10, $11, note
    stepod[$1] += $5 + $6; stepods[$1] += ods
    n[f]++; size[f] += $4; link[f] += $5 + $6; odss[f] += ods; fs[f] += $9; gz[f] += $10; zp[f] += $11
    T["n"]++; T["size"] += $4; T["up"] += $5; T["down"] += $6; T["odss"] += ods; T["fs"] += $9
    T["gz"] += $10; T["zp"] += $11
}
END {
    printf "\nper chain, updates only (release 0 not counted), sums:\n"
    cfmt = "%-42s %3s %9s %8s %8s %8s %8s %8s %8s %10s %10s\n"
    printf cfmt, "chain", "n", "new", "od link", "od s+s", "feed str", "feed/od", "gzip9", "zstd-pat", "od s/zstd", "feed/zstd"
    for (i = 1; i <= nf; i++) {
        f = order[i]
        printf cfmt, f " " firstver[f] "-" lastver[f], n[f], size[f], link[f], odss[f], fs[f], r(fs[f], odss[f]), gz[f], zp[f], r(odss[f], zp[f]), r(fs[f], zp[f])
    }
    printf cfmt, "all updates", T["n"], T["size"], T["up"] + T["down"], T["odss"], T["fs"], r(T["fs"], T["odss"]), T["gz"], T["zp"], r(T["odss"], T["zp"]), r(T["fs"], T["zp"])

    printf "\nfeed steps, one submission each. link = relay A <-> accelerator, both ways, from just before the POST to the end\n"
    printf "of the users'"'"' fetches (A'"'"'s pulls included); A s+s, B s+s = upstream_bytes + signature_bytes moved at A (over\n"
    printf "the relay) and at B (from A, not on the relay); pref = the zone'"'"'s prefetched / prefetch_bytes counters\n"
    sfmt = "%-4s %5s %-7s %6s %7s %7s %5s %7s %11s %7s %11s %7s %7s %9s %9s\n"
    printf sfmt, "step", "paths", "csn", "up", "down", "link", "pulls", "A s+s", "A pref", "B s+s", "B pref", "od link", "od s+s", "to A ms", "to B ms"
    while ((getline line < steplog) > 0) {
        split(line, s, " ")
        ns++
        S["paths"] += s[2]; S["up"] += s[5]; S["down"] += s[6]; S["pulls"] += s[7]
        S["ass"] += s[8]; S["apn"] += s[9]; S["apb"] += s[10]; S["bss"] += s[11]; S["bpn"] += s[12]; S["bpb"] += s[13]
        S["od"] += stepod[s[1]]; S["ods"] += stepods[s[1]]
        ta[ns] = s[14]; tb[ns] = s[15]
        printf sfmt, s[1], s[2], s[3] "-" s[4], s[5], s[6], s[5] + s[6], s[7], s[8], s[9] "/" s[10], s[11], s[12] "/" s[13], stepod[s[1]], stepods[s[1]], s[14], s[15]
    }
    printf sfmt, "all", S["paths"], "", S["up"], S["down"], S["up"] + S["down"], S["pulls"], S["ass"], S["apn"] "/" S["apb"], S["bss"], S["bpn"] "/" S["bpb"], S["od"], S["ods"], "", ""

    odl = T["up"] + T["down"]; fl = S["up"] + S["down"]
    printf "\nall %d updates, link both ways (heads included):\n", T["n"]
    printf "  on demand                %9d B  %s gzip -9, %s zstd-patch\n", odl, r(odl, T["gz"]), r(odl, T["zp"])
    printf "  feed (A <-> accelerator) %9d B  %s gzip -9, %s zstd-patch (%d pulls included)\n", fl, r(fl, T["gz"]), r(fl, T["zp"]), S["pulls"]
    printf "  feed / on demand         %s\n", r(fl, odl)
    printf "stream+sig: on demand %d B, feed %d B at A (%s), B <- A %d B; per URL the feed'"'"'s coded answers sum to %d B\n", T["odss"], S["ass"], r(S["ass"], T["odss"]), S["bss"], T["fs"]
    printf "peers: gzip -9 %d B, zstd -19 --patch-from %d B (new releases %d B)\n", T["gz"], T["zp"], T["size"]
    if (idle_pulls > 0)
        printf "idle pulls of A (zone unchanged; between steps, not counted above): %d in %d s, %d B on the link, %.0f B each;\n  A'"'"'s upstream_bytes + signature_bytes moved %d meanwhile\n", idle_pulls, idle_s, idle_link, idle_link / idle_pulls, idle_moved
    else
        printf "idle pulls of A: none in %d s (%d B on the link)\n", idle_s, idle_link
    if (ns > 0) {
        sort(ta, ns); sort(tb, ns)
        printf "submit -> fresh at A:                min %.3f  median %.3f  max %.3f s over %d steps\n", ta[1] / 1000, median(ta, ns) / 1000, ta[ns] / 1000, ns
        printf "submit -> fresh everywhere (at B):   min %.3f  median %.3f  max %.3f s\n", tb[1] / 1000, median(tb, ns) / 1000, tb[ns] / 1000
    }
    printf "zone at A: %s\nzone at B: %s\n", zone_a, zone_b
}
' "$results"

if ((flagged > 0)); then
    lab_log "WARNING: $flagged of the updates were flagged (see the note column: on demand not coded, another basis, a hit; the accelerator answered no prefetch of the URL)"
fi
