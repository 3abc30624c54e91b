#!/usr/bin/env bash
# Link bytes of the corpus's release sequences through the proxy pair, as a
# user sees them (issue 20's "releases of real JS/HTML fetched in sequence
# (updates only), accelerator kept bodies"):
#
#   nginx ──► accelerator ──► byte-relay.py ──► client proxy ──► curl
#
# The `seq` lines of $CORPUS/MANIFEST form chains (bootstrap.css 5.2.0 →
# 5.2.3 → … → 5.3.3, jquery.js 3.5.0 → … → 3.7.1, …). Each chain is served
# at ONE URL, /PACKAGE/FILE: each release in turn is copied over the served
# file (a later mtime each time, so a new Last-Modified and ETag), then
# fetched through the client proxy with `curl -x`. nginx sends
# `Cache-Control: no-cache` there, so every fetch goes upstream (the client
# proxy revalidates its stored entry, and the accelerator codes the new
# release against the body it served last time, which it kept). The body
# curl got must equal the release byte for byte, or the script fails.
#
# What is counted, for each update (every fetch of a chain after its
# first): the bytes the relay between the client proxy and the accelerator
# carried, both ways, as TCP payload: `up` is the request (head, basis
# digest or signature headers, anything else the client proxy sent), `down`
# the response (head and hsync stream, chunked framing included); `link` =
# up + down. TCP/IP headers are not counted (nor TLS: the link is plain
# HTTP on loopback). Beside it, from the client proxy's /.rproxy/stats:
# `stream` (upstream_bytes: the coded body as it came) and `sig`
# (signature_bytes: basis signatures sent up), which leave the heads out.
# The first fetch of each chain is reported on the chain's line but not
# counted.
#
# Peers over the same updates, measured in the same run: gzip -9 -n of the
# new release, and zstd -19 --patch-from=PREVIOUS NEW (the sender holds the
# previous release: the practical limit). Ratios are link / gzip -9 and
# link / zstd-patch, per update, per chain and over all updates (sums).
#
# A fetch that was not coded (client `deltas` unmoved), that did not offer
# the URL's own entry as its basis (`basis_same_url`), or that was a cache
# hit (`hits` moved) is flagged in the row's note column and counted in a
# warning at the end; the figures still include it.
#
# Usage: scripts/bench-corpus-pair.sh   (scripts/bench-corpus.sh runs it
# after its tool figures unless NO_PAIR=1)
#   CORPUS=DIR   corpus folder (default ../shared/corpus from the repo root)
#   RPROXY, NGINX, CARGO_TARGET_DIR, KEEP_TMP, ACCEL_ARGS, CLIENT_ARGS:
#                see scripts/lib-nginx.sh
# Needs: nginx, curl, cmp, gzip, zstd, python3; cargo unless RPROXY is given.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init bench-corpus-pair
for tool in gzip zstd python3; do
    command -v "$tool" >/dev/null || lab_die "$tool is not installed"
done
corpus=$(lab_corpus)
[[ -n $corpus && -f $corpus/MANIFEST ]] || lab_die "no MANIFEST in corpus folder '${CORPUS:-$lab_repo/../shared/corpus}' (set CORPUS=...)"

# The release chains of the corpus's MANIFEST (lab_corpus_chains).
lab_corpus_chains "$corpus"

# public/PACKAGE/VERSION/FILE -> /PACKAGE/FILE: one URL per chain.
chain_url() {
    local path=${1#public/} file pkg
    file=${path##*/}
    pkg=${path%%/*}
    echo "/$pkg/$file"
}
declare -A url_seen=()
for chain in "${chains[@]}"; do
    url=$(chain_url "${chain%% *}")
    [[ ! -v url_seen[$url] ]] || lab_die "two chains would share the URL $url"
    url_seen[$url]=1
done

lab_build
root=$lab_tmp/www
mkdir -p "$root"
# no-cache: stored, but revalidated before each use, so every fetch goes
# upstream and a changed release comes back as a new body.
lab_start_nginx "$root" '        location / {
            add_header Cache-Control "no-cache" always;
        }'
lab_start_accelerator
lab_start_relay "$lab_accel_url"
lab_start_client "$lab_relay_url"

# Served files get mtimes a minute apart from here on: distinct ETags even
# when two releases have the same size, and no clock in the figures.
mtime=1704067200
# delta BEFORE AFTER NAME: how far counter NAME moved between two stats.
delta() { echo $(($(lab_field "$2" "$3") - $(lab_field "$1" "$3"))); }
results=$lab_tmp/results
: >"$results"
flagged=0

for chain in "${chains[@]}"; do
    read -r -a releases <<<"$chain"
    url=$(chain_url "${releases[0]}")
    served=$root$url
    mkdir -p "${served%/*}"
    prev=""
    for release in "${releases[@]}"; do
        src=$corpus/$release
        cp "$src" "$served.tmp"
        mtime=$((mtime + 60))
        touch -d "@$mtime" "$served.tmp"
        mv -f "$served.tmp" "$served"

        lab_check_alive
        c0=$(lab_stats "$lab_client_url")
        r0=$(lab_stats "$lab_relay_stats_url")
        curl -sS --fail -x "$lab_proxy" -D "$lab_tmp/head" -o "$lab_tmp/got" "$lab_nginx_url$url" ||
            lab_die "curl failed for $url ($release)"
        cmp -s "$lab_tmp/got" "$src" || lab_die "$url: the body curl got is not $release byte for byte"
        # The entry is committed just after the body's last byte; by then
        # every byte of this exchange has crossed the relay.
        lab_wait_field "$lab_client_url" stored $(($(lab_field "$c0" stored) + 1)) 10 >/dev/null
        c1=$(lab_stats "$lab_client_url")
        r1=$(lab_stats "$lab_relay_stats_url")
        up=$(delta "$r0" "$r1" up)
        down=$(delta "$r0" "$r1" down)
        stream=$(delta "$c0" "$c1" upstream_bytes)
        sig=$(delta "$c0" "$c1" signature_bytes)
        note=""
        (($(delta "$c0" "$c1" stored) >= 1)) || note+="not-stored,"
        (($(delta "$c0" "$c1" hits) == 0)) || note+="HIT,"
        if [[ -n $prev ]]; then
            (($(delta "$c0" "$c1" deltas) == 1)) || note+="NOT-CODED,"
            (($(delta "$c0" "$c1" basis_same_url) == 1)) || note+="basis-not-same-url,"
        fi
        cache_status=$(tr -d '\r' <"$lab_tmp/head" | sed -n 's/^[Cc]ache-[Ss]tatus: *//p' | head -n 1)
        size=$(lab_size "$src")
        gz=$(gzip -9 -n -c "$src" | wc -c | tr -d ' ')
        if [[ -n $prev ]]; then
            zp=$(zstd -qq -19 -c --patch-from="$corpus/$prev" "$src" | wc -c | tr -d ' ')
            [[ -z $note ]] || flagged=$((flagged + 1))
        else
            zp=-
        fi
        # url release size up down stream sig gzip zstd-patch note cache-status
        note=${note%,}
        cache_status=${cache_status// /_}
        echo "$url $release $size $up $down $stream $sig $gz $zp ${note:--} ${cache_status:--}" >>"$results"
        prev=$release
    done
done

awk -v corpus="$corpus" '
function ver(p,   n, a) { n = split(p, a, "/"); return a[n - 1] }
function r(a, b) { return b > 0 ? sprintf("%.3fx", a / b) : "n/a" }
function row(label, n, size, up, down, stream, sig, gz, zp) {
    printf "%-42s %3s %9d %7d %8d %8d %7d %8d %8d %8s %8s\n",
        label, n, size, up, down, up + down, stream + sig, gz, zp, r(up + down, gz), r(up + down, zp)
}
BEGIN {
    printf "corpus: %s\n", corpus
    printf "through the pair: nginx -> accelerator -> byte-counting relay -> client proxy -> curl\n"
    printf "link = relay bytes up (requests) + down (responses), heads included; stream+sig = the client proxy'"'"'s\n"
    printf "counters (upstream_bytes + signature_bytes: bodies and signatures, no heads)\n\n"
    fmt = "%-28s %-8s %9s %7s %8s %8s %7s %8s %8s %8s %8s  %s\n"
    printf fmt, "url", "release", "new", "up", "down", "link", "str+sig", "gzip9", "zstd-pat", "x gzip9", "x zstd-p", "note / Cache-Status"
}
{
    url = $1; v = ver($2)
    lastver[url] = v
    if (!(url in first)) { first[url] = $4 + $5; order[++nurls] = url; firstver[url] = v }
    else {
        n[url]++; size[url] += $3; up[url] += $4; down[url] += $5; stream[url] += $6; sig[url] += $7
        gz[url] += $8; zp[url] += $9
        T["n"]++; T["size"] += $3; T["up"] += $4; T["down"] += $5; T["stream"] += $6; T["sig"] += $7
        T["gz"] += $8; T["zp"] += $9
    }
    note = $10 == "-" ? "" : $10
    cs = $11
    gsub(/_/, " ", cs)
    link = $4 + $5
    if ($9 == "-")
        printf fmt, url, v, $3, $4, $5, link, $6 + $7, $8, "first", "(not", "counted)", (note != "" ? note " " : "") cs
    else
        printf fmt, url, v, $3, $4, $5, link, $6 + $7, $8, $9, r(link, $8), r(link, $9), (note != "" ? note " " : "") cs
}
END {
    printf "\nupdates only (each chain'"'"'s fetches after its first), sums:\n"
    printf "%-42s %3s %9s %7s %8s %8s %7s %8s %8s %8s %8s\n", "chain (first release not counted)", "n", "new", "up", "down", "link", "str+sig", "gzip9", "zstd-pat", "x gzip9", "x zstd-p"
    for (i = 1; i <= nurls; i++) {
        u = order[i]
        row(u " " firstver[u] "-" lastver[u], n[u], size[u], up[u], down[u], stream[u], sig[u], gz[u], zp[u])
    }
    row("all updates", T["n"], T["size"], T["up"], T["down"], T["stream"], T["sig"], T["gz"], T["zp"])
    printf "\nof the %d link bytes of the updates: stream %d (client upstream_bytes), signatures sent up %d,\n", T["up"] + T["down"], T["stream"], T["sig"]
    printf "the rest (%d: request and response heads, chunked framing) only the relay sees\n", T["up"] + T["down"] - T["stream"] - T["sig"]
}' "$results"

if ((flagged > 0)); then
    lab_log "WARNING: $flagged of the updates were flagged (see the note column: not coded, another basis, a hit, not stored)"
fi
