#!/usr/bin/env bash
# The cheapest update (issue 20's "cheapest update of a small file (one
# changed line)": target ≤ 1 KB on the link, heads included):
#
#   nginx ──► accelerator ──► byte-relay.py ──► client proxy ──► curl
#
# A small text (SIZE bytes, default 4000: 60-odd lines of words) is served
# by nginx with `Cache-Control: no-cache`; it is fetched once, one line in
# its middle is changed, and it is fetched again. What is counted for the
# second fetch: every byte the relay between the proxies carried, both
# ways, as TCP payload (request head, response head, hsync stream, chunked
# framing). Beside it, measured in the same run: the response head nginx
# sends for the file alone (the heads' floor, one way), gzip -9 of the new
# version, and zstd -19 --patch-from (old → new).
#
# Usage: scripts/bench-small.sh   (SIZE=4000)
#   RPROXY, NGINX, CARGO_TARGET_DIR, KEEP_TMP, ACCEL_ARGS, CLIENT_ARGS:
#   see scripts/lib-nginx.sh
# Needs: nginx, curl, cmp, gzip, zstd, python3.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init bench-small
for tool in gzip zstd python3 curl; do
    command -v "$tool" >/dev/null || lab_die "$tool is not installed"
done
size=${SIZE:-4000}
lab_build
root=$lab_tmp/www
mkdir -p "$root"
python3 - "$root" "$size" <<'EOF'
import random, sys
root, size = sys.argv[1], int(sys.argv[2])
rng = random.Random(3)
words = [''.join(rng.choice('abcdefghijklmnop') for _ in range(rng.randint(2, 9))) for _ in range(500)]
lines, length = [], 0
while length < size:
    line = ' '.join(rng.choice(words) for _ in range(10))
    lines.append(line)
    length += len(line) + 1
old = ('\n'.join(lines) + '\n').encode()[:size]
new_lines = old.decode().split('\n')
new_lines[len(new_lines) // 2] = 'this line changed in the second release'
open(f'{root}/old.txt', 'wb').write(old)
open(f'{root}/new.txt', 'wb').write('\n'.join(new_lines).encode())
EOF
cp "$root/old.txt" "$root/page.txt"
touch -d '@1704067200' "$root/page.txt"
lab_start_nginx "$root" '        location / {
            add_header Cache-Control "no-cache" always;
        }'
lab_start_accelerator
lab_start_relay "$lab_accel_url"
lab_start_client "$lab_relay_url"

curl -sS --fail -x "$lab_proxy" -o "$lab_tmp/got" "$lab_nginx_url/page.txt"
cmp -s "$lab_tmp/got" "$root/old.txt" || lab_die "the first fetch is not the old version"
lab_wait_field "$lab_client_url" stored 1 10 >/dev/null

cp "$root/new.txt" "$root/page.txt.tmp"
touch -d '@1704067260' "$root/page.txt.tmp"
mv -f "$root/page.txt.tmp" "$root/page.txt"
r0=$(lab_stats "$lab_relay_stats_url")
c0=$(lab_stats "$lab_client_url")
curl -sS --fail -x "$lab_proxy" -o "$lab_tmp/got" "$lab_nginx_url/page.txt"
cmp -s "$lab_tmp/got" "$root/new.txt" || lab_die "the second fetch is not the new version"
lab_wait_field "$lab_client_url" stored 2 10 >/dev/null
r1=$(lab_stats "$lab_relay_stats_url")
c1=$(lab_stats "$lab_client_url")
up=$(($(lab_field "$r1" up) - $(lab_field "$r0" up)))
down=$(($(lab_field "$r1" down) - $(lab_field "$r0" down)))
stream=$(($(lab_field "$c1" upstream_bytes) - $(lab_field "$c0" upstream_bytes)))
deltas=$(($(lab_field "$c1" deltas) - $(lab_field "$c0" deltas)))

# nginx's own response head for the file, fetched directly: the floor.
nginx_head=$(curl -sS -D - -o /dev/null "$lab_nginx_url/page.txt" | wc -c | tr -d ' ')
gzip9=$(gzip -9 -n -c "$root/new.txt" | wc -c | tr -d ' ')
zstd_patch=$(zstd -qq -19 -c --patch-from="$root/old.txt" "$root/new.txt" | wc -c | tr -d ' ')
printf 'bench-small: %d-byte text, one line changed; coded as a delta: %s\n' \
    "$(lab_size "$root/new.txt")" "$([[ $deltas == 1 ]] && echo yes || echo NO)"
printf '  link %5d B (up %d + down %d; stream %d)   target 1024\n' $((up + down)) "$up" "$down" "$stream"
printf '  peers: nginx response head alone %d B; gzip -9 %d B; zstd -19 --patch-from %d B\n' \
    "$nginx_head" "$gzip9" "$zstd_patch"
