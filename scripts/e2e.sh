#!/usr/bin/env bash
# End-to-end check of the proxy pair with real programs on every side:
#
#   curl ──► rproxy client ══ hsync ══► rproxy accelerator ──► nginx
#
# nginx (Debian's) serves two releases of one file from a temp dir. Through
# the client proxy (`curl -x`) the script fetches the older release, then
# the newer one, and checks that
#   - both arrive byte for byte (cmp against the files nginx serves);
#   - the second one crossed the hsync link as a delta (client `deltas` and
#     accelerator `coded` went up by one) and its link bytes (stream +
#     basis signature) are under 25 % of the file;
#   - a gateway request (origin-form, `curl http://CLIENT/path`) arrives
#     byte for byte too;
#   - fetching the newer URL again is a cache hit (Cache-Status) that
#     uses no link bytes.
# It prints bytes per fetch, link bytes and the ratio, and exits non-zero
# with a message saying what went wrong. Every process and temp file it
# made is gone afterwards, whatever happened.
#
# Usage: scripts/e2e.sh   (CI runs it after scripts/test.sh)
#   CORPUS=DIR   corpus folder (default ../shared/corpus from the repo root;
#                without it the bundled tests/data/jquery releases are used)
#   MAX_LINK_RATIO=0.25   link bytes / file size the delta must stay under
#   RPROXY, NGINX, CARGO_TARGET_DIR, KEEP_TMP: see scripts/lib-nginx.sh
# Needs: nginx, curl, cmp; cargo unless RPROXY is given.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init e2e
lab_build

# The two releases: the corpus's if it is there, else the bundled ones.
corpus=$(lab_corpus)
if [[ -n $corpus && -f $corpus/public/jquery/3.6.4/jquery.js && -f $corpus/public/jquery/3.7.0/jquery.js ]]; then
    old_src=$corpus/public/jquery/3.6.4/jquery.js old_ver=3.6.4
    new_src=$corpus/public/jquery/3.7.0/jquery.js new_ver=3.7.0
else
    old_src=$lab_repo/tests/data/jquery/3.7.0/jquery.js old_ver=3.7.0
    new_src=$lab_repo/tests/data/jquery/3.7.1/jquery.js new_ver=3.7.1
fi
[[ -f $old_src && -f $new_src ]] || lab_die "release files not found: $old_src $new_src"
root=$lab_tmp/www
mkdir -p "$root/jquery/$old_ver" "$root/jquery/$new_ver"
cp "$old_src" "$root/jquery/$old_ver/jquery.js"
cp "$new_src" "$root/jquery/$new_ver/jquery.js"
old=$root/jquery/$old_ver/jquery.js
new=$root/jquery/$new_ver/jquery.js
# An old Last-Modified gives them heuristic freshness (10 % of their age,
# capped at a day), so the repeat fetch below is a cache hit.
touch -d '2024-01-01 00:00:00 UTC' "$old" "$new"
lab_log "origin files: jquery $old_ver ($(lab_size "$old") B), jquery $new_ver ($(lab_size "$new") B)"

lab_start_nginx "$root"
lab_start_pair
lab_log "nginx $lab_nginx_url, accelerator $lab_accel_url, client $lab_client_url"

# Sanity: nginx itself serves the files.
curl -sS --fail --max-time 10 "$lab_nginx_url/jquery/$old_ver/jquery.js" -o "$lab_tmp/direct.js" ||
    lab_die "nginx does not serve /jquery/$old_ver/jquery.js"
cmp -s "$lab_tmp/direct.js" "$old" || lab_die "nginx served wrong bytes (origin set-up problem)"

# fetch NAME URL FILE [CURL_ARGS...]: fetch, cmp against FILE, and record
# the link bytes (client upstream_bytes + signature_bytes) and counters the
# fetch added. Sets f_link, f_stream, f_sig, f_deltas, f_coded, f_status.
fetch() {
    local name=$1 url=$2 file=$3
    shift 3
    local before_c before_a after_c after_a out headers code want_up
    before_c=$(lab_stats "$lab_client_url")
    before_a=$(lab_stats "$lab_accel_url")
    out=$lab_tmp/$name.out
    headers=$lab_tmp/$name.headers
    if ! code=$(curl -sS --max-time 60 "$@" -D "$headers" -o "$out" -w '%{http_code}' "$url"); then
        lab_check_alive
        lab_die "$name: curl failed for $url"
    fi
    lab_check_alive
    [[ $code == 200 ]] || lab_die "$name: status $code for $url (headers: $(tr -d '\r' <"$headers" | tr '\n' ' '))"
    if ! cmp -s "$out" "$file"; then
        lab_die "$name: wrong bytes for $url: got $(lab_size "$out") B, want $(lab_size "$file") B ($(cmp "$out" "$file" 2>&1 | head -n 1))"
    fi
    if grep -qi '^content-encoding:.*hsync' "$headers"; then
        lab_die "$name: the user agent got Content-Encoding: hsync"
    fi
    f_status=$(tr -d '\r' <"$headers" | sed -n 's/^[Cc]ache-[Ss]tatus: *//p' | head -n 1)
    # The accelerator counts its stream when the last byte has left, the
    # client its upstream bytes when the transfer is checked: wait for both.
    want_up=$(lab_field "$before_a" coded_stream_bytes)
    after_a=$(lab_stats "$lab_accel_url")
    if (($(lab_field "$after_a" coded) > $(lab_field "$before_a" coded))); then
        lab_wait_field "$lab_accel_url" coded_stream_bytes $((want_up + 1)) >/dev/null
        after_a=$(lab_stats "$lab_accel_url")
    fi
    lab_wait_field "$lab_client_url" downstream_bytes \
        $(($(lab_field "$before_c" downstream_bytes) + $(lab_size "$file"))) >/dev/null
    after_c=$(lab_stats "$lab_client_url")
    f_stream=$(($(lab_field "$after_c" upstream_bytes) - $(lab_field "$before_c" upstream_bytes)))
    f_sig=$(($(lab_field "$after_c" signature_bytes) - $(lab_field "$before_c" signature_bytes)))
    f_link=$((f_stream + f_sig))
    f_deltas=$(($(lab_field "$after_c" deltas) - $(lab_field "$before_c" deltas)))
    f_coded=$(($(lab_field "$after_a" coded) - $(lab_field "$before_a" coded)))
    f_accel_stream=$(($(lab_field "$after_a" coded_stream_bytes) - $(lab_field "$before_a" coded_stream_bytes)))
    f_failures=$(($(lab_field "$after_c" digest_failures) - $(lab_field "$before_c" digest_failures)))
    ((f_failures == 0)) || lab_die "$name: the client counted $f_failures digest failure(s)"
    printf '  %-28s %9d B to curl, link %8d B (stream %d + signature %d), %s\n' \
        "$name" "$(lab_size "$file")" "$f_link" "$f_stream" "$f_sig" "${f_status:-no Cache-Status}" >&2
}

pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b ? 100 * a / b : 0 }'; }

echo "e2e: fetches through the client proxy (curl -x $lab_proxy):" >&2

fetch "forward $old_ver (cold)" "$lab_nginx_url/jquery/$old_ver/jquery.js" "$old" -x "$lab_proxy"
old_link=$f_link
((f_coded == 1)) || lab_die "first fetch: the accelerator coded $f_coded responses, want 1 (hsync not offered?)"

fetch "forward $new_ver (delta)" "$lab_nginx_url/jquery/$new_ver/jquery.js" "$new" -x "$lab_proxy"
new_link=$f_link new_stream=$f_stream new_sig=$f_sig
((f_deltas == 1)) || lab_die "second fetch: client deltas went up by $f_deltas, want 1"
((f_coded == 1)) || lab_die "second fetch: accelerator coded went up by $f_coded, want 1"
((f_accel_stream == f_stream)) ||
    lab_die "second fetch: the accelerator sent $f_accel_stream stream bytes but the client counted $f_stream"
new_size=$(lab_size "$new")
max_ratio=${MAX_LINK_RATIO:-0.25}
if ! awk -v l="$new_link" -v s="$new_size" -v m="$max_ratio" 'BEGIN { exit !(l < m * s) }'; then
    lab_die "second fetch: $new_link link bytes for a $new_size B file ($(pct "$new_link" "$new_size") %), want < $(pct "$max_ratio" 1) %: not sent as a delta against the older release"
fi

fetch "gateway $new_ver" "$lab_client_url/jquery/$new_ver/jquery.js" "$new"

fetch "forward $new_ver (again)" "$lab_nginx_url/jquery/$new_ver/jquery.js" "$new" -x "$lab_proxy"
again_status=$f_status
[[ $again_status == *hit* ]] || lab_die "repeat fetch: Cache-Status '$again_status', want a hit (the entry is fresh)"
((f_link == 0)) || lab_die "repeat fetch: a cache hit used $f_link link bytes"

gz=$(gzip -9 -c "$new" | wc -c | tr -d ' ')
cat <<EOF
e2e: PASS
  jquery $old_ver cold:      $(lab_size "$old") B delivered, $old_link B on the hsync link
  jquery $new_ver as delta:  $new_size B delivered, $new_link B on the link (stream $new_stream + basis signature $new_sig)
  link / file size:         $(pct "$new_link" "$new_size") % (limit $(pct "$max_ratio" 1) %)
  link / gzip -9 ($gz B):  $(awk -v l="$new_link" -v g="$gz" 'BEGIN { printf "%.3f", l / g }')
  gateway request:          byte-identical
  repeat request:           ${again_status:-no Cache-Status}
EOF
