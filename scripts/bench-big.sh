#!/usr/bin/env bash
# Bytes on the link for a large body with small scattered edits (issue 20):
# a text of MB megabytes and a copy with EDITS edits of 8 bytes spread over
# it, fetched in turn through nginx -> accelerator -> client proxy -> curl.
# "On the link" is what crossed between the proxies, both ways: the coded
# body and the basis signature sent up (the client proxy's counters). The
# limit, measured in the same run: zstd -19 --long=27 --patch-from (the
# sender holds the old version), and gzip -9 of the new version.
#
# Three cases, each with a fresh pair and cache:
#   cold         the accelerator never saw the old version (--basis-store 0
#                --basis-dir off: no kept body at all)
#   kept         it served the old version just before (default settings:
#                bodies over --max-stored-body, 8M, are kept on disk, in
#                rproxy-basis in the spool dir, up to --max-disk-body, 1G)
#   kept, memory the same kept in memory: --basis-store 1G
#                --max-stored-body 128M --basis-dir off
#
# Usage: scripts/bench-big.sh     (MB=50 EDITS=100; RPROXY=PATH to skip the build)
# Needs: nginx, curl, zstd, gzip, python3.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init bench-big
mb=${MB:-50}
edits=${EDITS:-100}
for tool in curl zstd gzip python3; do
    command -v "$tool" >/dev/null || lab_die "$tool is not installed"
done
lab_build

root=$lab_tmp/www
mkdir -p "$root"
# A deterministic text (words from a small vocabulary, so it compresses as
# prose does), and the same with EDITS 8-byte edits at spread offsets.
python3 - "$root" "$mb" "$edits" <<'EOF'
import random, sys
root, mb, edits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(20)
words = [''.join(rng.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(rng.randint(2, 9)))
         for _ in range(5000)]
size = mb * 1_000_000
parts, length = [], 0
while length < size:
    line = ' '.join(rng.choice(words) for _ in range(12)) + '\n'
    parts.append(line)
    length += len(line)
old = ''.join(parts).encode()[:size]
new = bytearray(old)
for n in range(edits):
    at = (n * 2_654_435_761) % (size - 8)
    new[at:at + 8] = b'EDIT%04d' % n
open(f'{root}/old.txt', 'wb').write(old)
open(f'{root}/new.txt', 'wb').write(new)
EOF
lab_start_nginx "$root"
size=$(lab_size "$root/new.txt")

zstd_patch=$(zstd -q -19 --long=27 --patch-from="$root/old.txt" -c "$root/new.txt" | wc -c | tr -d ' ')
gzip9=$(gzip -9 -c "$root/new.txt" | wc -c | tr -d ' ')

# fetch NAME: old then new through the pair started last; prints the link
# bytes of the new one.
measure() {
    local name=$1 before after stream sig link
    curl -sS --fail -x "$lab_proxy" -o "$lab_tmp/got-old" "$lab_nginx_url/old.txt"
    cmp -s "$lab_tmp/got-old" "$root/old.txt" || lab_die "$name: old.txt came back different"
    lab_wait_field "$lab_client_url" stored 1 30 >/dev/null
    before=$(lab_stats "$lab_client_url")
    # The new version under the old one's URL prefix: the old one is its
    # basis (the longest shared prefix, same media type).
    curl -sS --fail -x "$lab_proxy" -o "$lab_tmp/got-new" "$lab_nginx_url/new.txt"
    cmp -s "$lab_tmp/got-new" "$root/new.txt" || lab_die "$name: new.txt came back different"
    lab_wait_field "$lab_client_url" stored 2 60 >/dev/null
    after=$(lab_stats "$lab_client_url")
    stream=$(($(lab_field "$after" upstream_bytes) - $(lab_field "$before" upstream_bytes)))
    sig=$(($(lab_field "$after" signature_bytes) - $(lab_field "$before" signature_bytes)))
    link=$((stream + sig))
    printf '  %-12s %12d B on the link (stream %d + signature %d): %8.1fx zstd --patch-from, %.4fx gzip -9\n' \
        "$name" "$link" "$stream" "$sig" \
        "$(awk -v a="$link" -v b="$zstd_patch" 'BEGIN { print a / b }')" \
        "$(awk -v a="$link" -v b="$gzip9" 'BEGIN { print a / b }')" >&2
}

# run NAME ACCEL_ARGS: a fresh pair (and cache), then measure.
run() {
    local name=$1
    if [[ -n ${lab_client_pid:-} ]]; then
        kill "$lab_accel_pid" "$lab_client_pid" 2>/dev/null || true
        wait "$lab_accel_pid" "$lab_client_pid" 2>/dev/null || true
        rm -rf "$lab_tmp/cache" "$lab_tmp/spool"
    fi
    # shellcheck disable=SC2119 # no client wrapper
    ACCEL_ARGS=$2 CACHE_SIZE=4G lab_start_pair
    measure "$name"
}

lab_log "new.txt: $size B, $edits edits of 8 B; gzip -9 $gzip9 B; zstd -19 --long=27 --patch-from $zstd_patch B"
run cold "--basis-store 0 --basis-dir off"
run kept ""
run "kept, memory" "--basis-store 1G --max-stored-body 128M --basis-dir off"
