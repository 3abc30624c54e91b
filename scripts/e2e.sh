#!/usr/bin/env bash
# End-to-end check of the proxy pair with real programs on every side:
#
#   curl, apt-get ──► rproxy client ══ hsync ══► rproxy accelerator ──► nginx
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
# Then a real user agent, apt-get, with the client proxy as its
# Acquire::http::Proxy and its own config, state and cache in the temp dir
# (nothing of /etc/apt is read), against a flat repository nginx serves at
# /debian/ (`deb [trusted=yes] http://127.0.0.1:NGINXPORT/debian/ ./`): an
# uncompressed Packages of 401 stanzas (~330 KB, one real package built
# with dpkg-deb, 400 made up) and a Release with its hashes. It checks that
#   - `apt-get update` exits 0 without W:/E:/Err: lines and keeps a
#     Packages list equal (cmp) to the origin's, three times: cold; after
#     release 2 (a new version of the real package and of three others);
#     and with nothing changed;
#   - apt's requests reached the client proxy (its `requests`) and, through
#     the accelerator, nginx (APT-HTTP lines in its log), and the client's
#     upstream bytes equal the accelerator's coded stream bytes;
#   - update 2 crossed as deltas: client `deltas` and accelerator `coded`
#     up by 2 (Release and Packages), and all its link bytes (streams +
#     basis signatures) under MAX_LINK_RATIO of Packages;
#   - update 3: apt's max-age=0 makes the client revalidate Release (even
#     within the second it stored it) and no body crosses the link;
#   - `apt-get download` of the new version gives the origin's .deb (cmp).
# Then issue 18's topology, every rproxy process started with a TOML
# config file (--config): three nginx virtual hosts, a.test and b.test on
# nginx's port and c.test on a port of its own, each a file in two
# versions; two accelerator processes, A with a [[site]] for a.test and B
# with one for b.test (B trusting loopback as a forwarder); a parent-mode
# accelerator (origin = "any" for localhost, nginx's ports, 127.0.0.0/8,
# origin-ca the test's certificate); an "edge" client proxy with routes
# a.test -> A, b.test -> B, localhost -> the parent, * -> direct (allowed
# 127.0.0.0/8) and CONNECT to nginx's TLS port; an "outer" client proxy
# whose upstream is the edge. A certificate for localhost is made by
# openssl at the start (nginx's TLS server uses it). It checks that
#   - through the edge (curl -x), version 1 then 2 of each site's file
#     arrive byte for byte; a.test's and b.test's second versions came as
#     deltas (edge `deltas` +1, A's or B's `coded` +1, link bytes under
#     MAX_LINK_RATIO), the other accelerator's `coded` unmoved; c.test's
#     came direct and whole (no delta, upstream bytes >= the file);
#   - nginx was told who asked: for a.test `Forwarded:
#     for=127.0.0.1;host="a.test";proto=http` and `X-Forwarded-For:
#     127.0.0.1`, what curl made up replaced (A trusts no one); for b.test
#     the edge's element (it replaced what curl made up: it trusts no user
#     agent) with B's appended (B trusts loopback);
#   - `curl -x EDGE --cacert cert.pem https://localhost:TLSPORT/...`
#     (a CONNECT tunnel) gives the file, and the edge's `tunnels` went up
#     by 1;
#   - http://localhost:NGINXPORT/ URLs routed through the parent arrive
#     byte for byte, the second as a delta (parent `coded`, edge
#     `deltas`); an absolute-form `GET https://localhost:TLSPORT/...` sent
#     to the parent itself (curl --request-target; the client proxy
#     CONNECTs https:// URLs instead) is fetched over TLS with origin-ca
#     and arrives byte for byte, nginx's TLS server logging the parent's
#     Forwarded;
#   - through the chain (curl -x OUTER -> edge -> A), a fresh file's
#     second version is a delta at both client proxies: the outer's
#     `deltas` +1 with link bytes under MAX_LINK_RATIO (the edge coded it
#     toward the outer) and the edge's +1 (A coded it toward the edge).
# It prints bytes per fetch, link bytes and the ratio, and exits non-zero
# with a message saying what went wrong. Every process and temp file it
# made is gone afterwards, whatever happened.
#
# Usage: scripts/e2e.sh   (CI runs it after scripts/test.sh)
#   CORPUS=DIR   corpus folder (default ../shared/corpus from the repo root;
#                without it the bundled tests/data/jquery releases are used)
#   MAX_LINK_RATIO=0.25   link bytes / file size the delta must stay under
#   APT_STANZAS=400       made-up stanzas in the apt repository's Packages
#   RPROXY, NGINX, CARGO_TARGET_DIR, KEEP_TMP: see scripts/lib-nginx.sh
# Needs: nginx (with ssl), curl, cmp, openssl, apt-get, dpkg-deb, md5sum,
# sha256sum; cargo unless RPROXY is given.
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

# The apt part's origin: a flat Debian repository under /debian/ (see
# "apt through the proxy" below for what is checked). Release 1 is built
# now; release 2 replaces Packages, Release and the package's .deb later.
for tool in apt-get dpkg-deb sha256sum md5sum; do
    command -v "$tool" >/dev/null ||
        lab_die "$tool is not installed: the apt check needs Debian's apt and dpkg (apt-get install -y apt dpkg coreutils)"
done
repo=$root/debian
mkdir -p "$repo/pool"
apt_pkg=rproxy-e2e-hello

# apt_deb VERSION: a tiny real package, pool/${apt_pkg}_VERSION_all.deb.
apt_deb() {
    local ver=$1 src=$lab_tmp/debsrc/$1
    mkdir -p "$src/DEBIAN" "$src/usr/share/doc/$apt_pkg"
    cat >"$src/DEBIAN/control" <<EOF
Package: $apt_pkg
Version: $ver
Architecture: all
Maintainer: rproxy e2e <e2e@example.invalid>
Section: misc
Priority: optional
Description: end-to-end test package of rproxy
 Fetched by apt-get download through the client proxy.
EOF
    printf 'rproxy e2e hello, release %s\n' "$ver" >"$src/usr/share/doc/$apt_pkg/README"
    dpkg-deb --root-owner-group -Zgzip --build "$src" "$repo/pool/${apt_pkg}_${ver}_all.deb" >/dev/null ||
        lab_die "dpkg-deb could not build $apt_pkg $ver"
}

# apt_release GEN VERSION: Packages (the real package's stanza, then
# APT_STANZAS made-up ones of ~600 B; release 2 gives three of them a new
# upload) and a Release listing its hashes, all dated day GEN of 2024.
apt_release() {
    local gen=$1 ver=$2 deb
    deb=pool/${apt_pkg}_${ver}_all.deb
    {
        cat <<EOF
Package: $apt_pkg
Version: $ver
Architecture: all
Maintainer: rproxy e2e <e2e@example.invalid>
Installed-Size: 1
Section: misc
Priority: optional
Filename: $deb
Size: $(lab_size "$repo/$deb")
MD5sum: $(md5sum <"$repo/$deb" | cut -d' ' -f1)
SHA256: $(sha256sum <"$repo/$deb" | cut -d' ' -f1)
Description: end-to-end test package of rproxy
 Fetched by apt-get download through the client proxy.

EOF
        awk -v n="${APT_STANZAS:-400}" -v gen="$gen" '
        BEGIN {
            srand(20240101)
            nw = split("data network library client server proxy cache delta " \
                "stream parser format tool utility daemon module plugin kernel " \
                "driver graphics audio video font theme editor compiler debugger " \
                "shell script python perl ruby java rust haskell ocaml test " \
                "documentation development runtime shared static headers bindings " \
                "interface protocol archive compression encryption signature " \
                "database query index search text image document printer scanner " \
                "monitor logging metrics configuration management system service", w, " ")
            for (i = 1; i <= n; i++) {
                # The same draws in both releases, so only the bumped
                # stanzas differ.
                name = sprintf("%s-%s%d", w[int(rand() * nw) + 1], w[int(rand() * nw) + 1], i)
                major = int(rand() * 9); minor = int(rand() * 30); rev = int(rand() * 5) + 1
                bumped = gen == 2 && (i == 57 || i == 211 || i == 333)
                if (bumped) rev += 1
                ver = major "." minor "-" rev
                printf "Package: %s\nVersion: %s\nArchitecture: all\n", name, ver
                printf "Maintainer: Debian %s Team <%s@lists.example.org>\n", w[int(rand() * nw) + 1], name
                printf "Installed-Size: %d\n", int(rand() * 5000) + 10
                printf "Depends: libc6 (>= 2.%d), %s-common (= %s)\n", int(rand() * 36), name, ver
                printf "Section: %s\nPriority: optional\n", w[int(rand() * nw) + 1]
                printf "Homepage: https://%s.example.org/\n", name
                printf "Filename: pool/main/%s/%s/%s_%s_all.deb\n", substr(name, 1, 1), name, name, ver
                size = int(rand() * 900000) + 1000
                md5 = ""; for (k = 0; k < 32; k++) md5 = md5 sprintf("%x", int(rand() * 16))
                sha = ""; for (k = 0; k < 64; k++) sha = sha sprintf("%x", int(rand() * 16))
                if (bumped) { size += 17; md5 = substr(md5, 2) "0"; sha = substr(sha, 2) "0" }
                printf "Size: %d\nMD5sum: %s\nSHA256: %s\n", size, md5, sha
                printf "Description: %s %s for %s\n", w[int(rand() * nw) + 1], w[int(rand() * nw) + 1], name
                lines = int(rand() * 4) + 2
                for (l = 0; l < lines; l++) {
                    line = ""
                    for (k = 0; k < 10; k++) line = line " " w[int(rand() * nw) + 1]
                    print line "."
                }
                print ""
            }
        }'
    } >"$repo/Packages"
    cat >"$repo/Release" <<EOF
Origin: rproxy-e2e
Label: rproxy-e2e
Suite: stable
Codename: e2e
Date: $(date -u -d "2024-01-0$gen" '+%a, %d %b %Y %H:%M:%S UTC')
MD5Sum:
 $(md5sum <"$repo/Packages" | cut -d' ' -f1) $(lab_size "$repo/Packages") Packages
SHA256:
 $(sha256sum <"$repo/Packages" | cut -d' ' -f1) $(lab_size "$repo/Packages") Packages
EOF
    # Old dates, as a mirror's files have: the client proxy holds them
    # fresh by heuristic, so only apt's own max-age=0 makes it ask again.
    touch -d "2024-01-0$gen 00:00:00 UTC" "$repo/Packages" "$repo/Release" "$repo/$deb"
}
apt_deb 1.0
apt_release 1 1.0
lab_log "apt repository: Packages $(lab_size "$repo/Packages") B ($(grep -c '^Package:' "$repo/Packages") stanzas), $apt_pkg 1.0"

# ---- issue 18's topology: the origins --------------------------------
# Three virtual hosts with a tree each, every tree with a file in two
# versions: a.test the two jquery releases (twice: /jquery/ for the
# client proxy's routes, /chain/ for the chain of client proxies), b.test
# and c.test a generated text file (/notes/1/ and /notes/2/). a.test and
# b.test share nginx's port; c.test has a port of its own where it is the
# default server (see the direct route below). A TLS server on one more
# port serves $root as localhost, with a certificate made now.
command -v openssl >/dev/null ||
    lab_die "openssl is not installed: the TLS checks need it (apt-get install -y openssl)"
tls_dir=$lab_tmp/tls
mkdir -p "$tls_dir"
# CA:FALSE: `openssl req -x509` marks its certificate a CA by default, and
# rustls (webpki) then refuses it as a server's own certificate
# (CaUsedAsEndEntity: the parent's 502 says so) though curl takes it.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE \
    -keyout "$tls_dir/key.pem" -out "$tls_dir/cert.pem" >"$lab_tmp/logs/openssl.log" 2>&1 ||
    { cat "$lab_tmp/logs/openssl.log" >&2; lab_die "openssl could not make a self-signed certificate"; }
sites=$lab_tmp/sites
for dir in jquery chain; do
    mkdir -p "$sites/a/$dir/$old_ver" "$sites/a/$dir/$new_ver"
    cp "$old" "$sites/a/$dir/$old_ver/jquery.js"
    cp "$new" "$sites/a/$dir/$new_ver/jquery.js"
done
# notes SITE VERSION: ~190 KB of text; version 2 changes one line in 200.
notes() {
    mkdir -p "$sites/$1/notes/$2"
    awk -v site="$1" -v ver="$2" 'BEGIN {
        for (i = 0; i < 3000; i++) {
            if (ver == 2 && i % 200 == 100) print "line " i " of " site ", rewritten in version 2"
            else printf "%s line %d: the quick brown fox jumps over the lazy dog %d\n", site, i, (i * 7919) % 1000
        }
    }' >"$sites/$1/notes/$2/notes.txt"
}
for site in b c; do
    notes "$site" 1
    notes "$site" 2
done
nginx_port=$(lab_free_port)
c_port=$(lab_free_port)
tls_port=$(lab_free_port)
vhosts="
    server {
        listen 127.0.0.1:$nginx_port;
        server_name a.test;
        root $sites/a;
    }
    server {
        listen 127.0.0.1:$nginx_port;
        server_name b.test;
        root $sites/b;
    }
    server {
        listen 127.0.0.1:$c_port default_server;
        server_name c.test;
        root $sites/c;
    }
    server {
        listen 127.0.0.1:$tls_port ssl;
        server_name localhost;
        ssl_certificate $tls_dir/cert.pem;
        ssl_certificate_key $tls_dir/key.pem;
        root $root;
    }"

NGINX_PORT=$nginx_port lab_start_nginx "$root" "" "$vhosts"
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

# ---- apt through the proxy -------------------------------------------
# apt-get with a configuration of its own (APT_CONFIG; /etc/apt and its
# conf.d, e.g. Docker's docker-clean which turns pkgcache.bin off, are not
# read), state and cache in the temp dir, the client proxy as its HTTP
# proxy. The source is the origin itself, so apt asks the client proxy for
# http://127.0.0.1:NGINXPORT/debian/... in absolute form.
apt_dir=$lab_tmp/apt
mkdir -p "$apt_dir/state/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/dl" "$apt_dir/log"
: >"$apt_dir/status"
echo "deb [trusted=yes] $lab_nginx_url/debian/ ./" >"$apt_dir/sources.list"
cat >"$apt_dir/apt.conf" <<EOF
Dir::Etc::main "/dev/null";
Dir::Etc::parts "/dev/null";
Dir::Etc::sourcelist "$apt_dir/sources.list";
Dir::Etc::sourceparts "/dev/null";
Dir::Etc::preferences "/dev/null";
Dir::Etc::preferencesparts "/dev/null";
Dir::State "$apt_dir/state";
Dir::State::status "$apt_dir/status";
Dir::Cache "$apt_dir/cache";
Dir::Log "$apt_dir/log";
Debug::NoLocking "true";
APT::Sandbox::User "root";
APT::Get::List-Cleanup "false";
Acquire::Languages "none";
Acquire::Retries "0";
Acquire::http::Timeout "20";
Acquire::http::Proxy "$lab_proxy/";
EOF
chmod -R a+rX "$apt_dir"

# apt_get NAME ARGS...: runs apt-get ARGS in $apt_dir/dl, log in
# logs/apt-NAME.log; fails on a non-zero exit or any W:/E:/Err: line.
# Sets what the run added: a_requests (apt's requests to the client
# proxy), a_origin (apt's requests in nginx's log), a_link (client
# upstream + signature bytes), a_stream, a_sig, a_deltas, a_hits,
# a_revalidated (client), a_coded, a_accel_stream (accelerator).
apt_get() {
    local name=$1 log=$lab_tmp/logs/apt-$1.log
    local before_c before_a after_c after_a prev now origin_before settled failures
    shift
    origin_before=$(grep -c 'APT-HTTP' "$lab_tmp/logs/nginx-access.log" || true)
    before_a=$(lab_stats "$lab_accel_url")
    before_c=$(lab_stats "$lab_client_url")
    if ! (cd "$apt_dir/dl" && env -u http_proxy -u HTTP_PROXY -u no_proxy -u NO_PROXY \
        APT_CONFIG="$apt_dir/apt.conf" apt-get -q "$@") >"$log" 2>&1; then
        lab_check_alive
        cat "$log" >&2
        lab_die "$name: apt-get $* failed (log above)"
    fi
    lab_check_alive
    if grep -Eq '^(W|E|Err):' "$log"; then
        cat "$log" >&2
        lab_die "$name: apt-get $* warned or failed (log above)"
    fi
    # Stats reads are not counted as requests.
    after_c=$(lab_stats "$lab_client_url")
    a_requests=$(($(lab_field "$after_c" requests) - $(lab_field "$before_c" requests)))
    # apt has every byte, but both proxies count a transfer just after
    # its end: read until the byte counters stop moving and agree.
    settled=0 prev=""
    for _ in $(seq 50); do
        after_a=$(lab_stats "$lab_accel_url")
        after_c=$(lab_stats "$lab_client_url")
        a_stream=$(($(lab_field "$after_c" upstream_bytes) - $(lab_field "$before_c" upstream_bytes)))
        # What the accelerator sent on the link: coded streams, and bodies
        # too small to gain from coding, sent plain.
        a_accel_stream=$(($(lab_field "$after_a" link_bytes) - $(lab_field "$before_a" link_bytes)))
        now="$a_stream $a_accel_stream $(lab_field "$after_c" signature_bytes) $(lab_field "$after_c" downstream_bytes) $(lab_field "$after_a" coded)"
        if [[ $now == "$prev" ]] && ((a_stream == a_accel_stream)); then
            settled=1
            break
        fi
        prev=$now
        sleep 0.05
    done
    a_sig=$(($(lab_field "$after_c" signature_bytes) - $(lab_field "$before_c" signature_bytes)))
    a_link=$((a_stream + a_sig))
    a_deltas=$(($(lab_field "$after_c" deltas) - $(lab_field "$before_c" deltas)))
    a_hits=$(($(lab_field "$after_c" hits) - $(lab_field "$before_c" hits)))
    a_revalidated=$(($(lab_field "$after_c" revalidated) - $(lab_field "$before_c" revalidated)))
    a_coded=$(($(lab_field "$after_a" coded) - $(lab_field "$before_a" coded)))
    a_origin=$(($(grep -c 'APT-HTTP' "$lab_tmp/logs/nginx-access.log" || true) - origin_before))
    failures=$(($(lab_field "$after_c" digest_failures) - $(lab_field "$before_c" digest_failures)))
    ((failures == 0)) || lab_die "$name: the client counted $failures digest failure(s)"
    ((settled)) ||
        lab_die "$name: the accelerator sent $a_accel_stream link bytes but the client counted $a_stream"
    ((a_requests > 0)) || lab_die "$name: apt-get made no request to the client proxy (log: $(tr '\n' ' ' <"$log"))"
    ((a_origin > 0 && a_origin <= a_requests)) ||
        lab_die "$name: nginx logged $a_origin requests from apt, apt made $a_requests to the client proxy"
    printf '  %-28s %d requests (%d at nginx), link %6d B (stream %d + signatures %d), deltas %d, coded %d, hits %d, revalidated %d\n' \
        "$name" "$a_requests" "$a_origin" "$a_link" "$a_stream" "$a_sig" "$a_deltas" "$a_coded" "$a_hits" "$a_revalidated" >&2
}



# The Packages file apt keeps for our source must be the origin's.
apt_lists_check() {
    local name=$1 lists
    lists=$(find "$apt_dir/state/lists" -maxdepth 1 -name '*_Packages' | head -n 1)
    [[ -n $lists ]] || lab_die "$name: apt kept no Packages list ($(ls "$apt_dir/state/lists" | tr '\n' ' '))"
    cmp -s "$lists" "$repo/Packages" ||
        lab_die "$name: apt's Packages list differs from the origin's ($(lab_size "$lists") B vs $(lab_size "$repo/Packages") B)"
}

echo "e2e: apt-get through the client proxy (Acquire::http::Proxy $lab_proxy/):" >&2
apt_packages_1=$(lab_size "$repo/Packages")
apt_get "apt update 1 (cold)" update
apt_lists_check "apt update 1"
apt1_link=$a_link
# Packages is coded; the Release file may go plain: it is mostly hashes,
# and its hsync stream would be larger than itself (never worse than plain).
((a_coded >= 1)) || lab_die "apt update 1: the accelerator coded $a_coded responses, want Packages at least"

# Release 2: a new upload of the real package and of three others.
apt_deb 1.1
apt_release 2 1.1
apt_packages_2=$(lab_size "$repo/Packages")
apt_get "apt update 2 (delta)" update
apt_lists_check "apt update 2"
grep -q "^Version: 1.1$" "$apt_dir"/state/lists/*_Packages || lab_die "apt update 2: $apt_pkg 1.1 is not in apt's lists"
apt2_link=$a_link apt2_stream=$a_stream apt2_deltas=$a_deltas
# Release and Packages changed: Packages must come as a delta against the
# entry the client proxy holds, not whole (Release too, unless its stream
# would outgrow it; then it goes plain).
((a_deltas >= 1)) || lab_die "apt update 2: client deltas went up by $a_deltas, want Packages at least"
((a_coded >= 1)) || lab_die "apt update 2: accelerator coded went up by $a_coded, want Packages at least"
if ! awk -v l="$a_link" -v s="$apt_packages_2" -v m="$max_ratio" 'BEGIN { exit !(l < m * s) }'; then
    lab_die "apt update 2: $a_link link bytes for a $apt_packages_2 B Packages ($(pct "$a_link" "$apt_packages_2") %), want < $(pct "$max_ratio" 1) %: Packages not sent as a delta"
fi

# Nothing changed: apt asks again (max-age=0), the client proxy
# revalidates its Release (a 304 from nginx), and no body crosses the link.
apt_get "apt update 3 (unchanged)" update
apt_lists_check "apt update 3"
apt3_link=$a_link
((a_revalidated >= 1)) || lab_die "apt update 3: the client revalidated $a_revalidated entries, want Release (apt sent max-age=0)"
# Only nginx's 404 pages (for the files this repository lacks) may cross.
((a_coded == 0)) || lab_die "apt update 3: nothing changed, yet the accelerator coded $a_coded bodies"

# The new .deb, byte for byte (apt checks its SHA256 too).
apt_get "apt download $apt_pkg" download "$apt_pkg"
deb=${apt_pkg}_1.1_all.deb
[[ -f $apt_dir/dl/$deb ]] || lab_die "apt download: no $deb in $apt_dir/dl ($(ls "$apt_dir/dl" | tr '\n' ' '))"
cmp -s "$apt_dir/dl/$deb" "$repo/pool/$deb" || lab_die "apt download: $deb differs from the origin's"

# apt's requests reached nginx through the pair, not directly: each one
# nginx logged names the client proxy in its Via (each proxy appends a Via
# line of its own, and nginx 1.22's $http_via is the first line only; the
# accelerator's part shows in its `coded` counter above).
apt_at_origin=$(grep -c 'APT-HTTP' "$lab_tmp/logs/nginx-access.log" || true)
apt_via=$(grep 'APT-HTTP' "$lab_tmp/logs/nginx-access.log" | grep -c "via=\"1.1 127.0.0.1:${lab_client_port}[,\"]" || true)
((apt_at_origin > 0 && apt_via == apt_at_origin)) ||
    lab_die "nginx logged $apt_at_origin requests from apt, only $apt_via with the client proxy's Via (the others did not come through the pair)"

# ---- issue 18's topology: sites, routes, tunnels, a parent, a chain ---
# Every process from here on is the release binary with a TOML config
# file (--config):
#
#   curl ─► outer client ─► edge client ─┬─ a.test ──► accelerator A ─┐
#     │                        │         ├─ b.test ──► accelerator B ─┼─► nginx
#     └───────────────────────►│         ├─ localhost ► parent ───────┤   (http and
#                              │         └─ * direct ─────────────────┤    TLS)
#                              └─ CONNECT localhost:TLSPORT ──────────┘
#
# A and B are two accelerator processes, one [[site]] each (names a.test /
# b.test, origin nginx's port, which picks the virtual host by the Host
# the accelerator sends: the name asked for). B trusts loopback as a
# forwarder, A trusts no one. The parent is a third accelerator, one
# parent-mode site for localhost (its nginx ports, loopback addresses,
# the test's CA). The names a.test and b.test resolve nowhere: only the
# accelerators' sites know where they are. A direct route connects to the
# URL's own host with the system resolver, so c.test is reached as
# http://127.0.0.1:CPORT/, where nginx's default server is c.test's.
topo=$lab_tmp/topo
mkdir -p "$topo/cache-edge" "$topo/cache-outer"
accel_a_port=$(lab_free_port) accel_b_port=$(lab_free_port) parent_port=$(lab_free_port)
edge_port=$(lab_free_port) outer_port=$(lab_free_port)
accel_a_url=http://127.0.0.1:$accel_a_port accel_b_url=http://127.0.0.1:$accel_b_port
parent_url=http://127.0.0.1:$parent_port
edge_url=http://127.0.0.1:$edge_port outer_url=http://127.0.0.1:$outer_port
cat >"$topo/accel-a.toml" <<EOF
role = "accelerator"
listen = "127.0.0.1:$accel_a_port"

[[site]]
names = ["a.test"]
origin = "http://127.0.0.1:$nginx_port"
EOF
cat >"$topo/accel-b.toml" <<EOF
role = "accelerator"
listen = "127.0.0.1:$accel_b_port"
trusted-forwarders = ["127.0.0.0/8"]

[[site]]
names = ["b.test"]
origin = "http://127.0.0.1:$nginx_port"
EOF
cat >"$topo/parent.toml" <<EOF
role = "accelerator"
listen = "127.0.0.1:$parent_port"

[[site]]
names = ["*"]
origin = "any"
allow-hosts = ["localhost"]
allow-ports = [$nginx_port, $tls_port]
allow-addresses = ["127.0.0.0/8"]
origin-ca = "$tls_dir/cert.pem"
EOF
cat >"$topo/edge.toml" <<EOF
role = "client"
listen = "127.0.0.1:$edge_port"
cache = "$topo/cache-edge"
cache-size = "256M"
connect-ports = [$tls_port]
connect-allow-addresses = ["127.0.0.0/8"]

[[route]]
hosts = ["a.test"]
upstream = "$accel_a_url"

[[route]]
hosts = ["b.test"]
upstream = "$accel_b_url"

[[route]]
hosts = ["localhost"]
upstream = "$parent_url"

[[route]]
hosts = ["*"]
direct = true
allow-addresses = ["127.0.0.0/8"]
EOF
cat >"$topo/outer.toml" <<EOF
role = "client"
listen = "127.0.0.1:$outer_port"
cache = "$topo/cache-outer"
cache-size = "256M"
upstream = "$edge_url"
EOF
lab_start_rproxy accel-a accelerator "$topo/accel-a.toml" "$accel_a_url"
lab_start_rproxy accel-b accelerator "$topo/accel-b.toml" "$accel_b_url"
lab_start_rproxy parent accelerator "$topo/parent.toml" "$parent_url"
lab_start_rproxy edge client "$topo/edge.toml" "$edge_url"
lab_start_rproxy outer client "$topo/outer.toml" "$outer_url"

# counter URL NAME: one counter of a proxy, now.
counter() {
    lab_field "$(lab_stats "$1")" "$2"
}

# want_counter WHAT URL NAME VALUE: the counter must reach VALUE (within
# lab_wait_field's few seconds: some are counted after the last byte) and
# not pass it.
want_counter() {
    local got
    got=$(lab_wait_field "$2" "$3" "$4")
    ((got == $4)) || lab_die "$1: $3 of $2 is $got, want $4"
}

# t_get NAME FILE CURL_ARGS...: curl CURL_ARGS (the URL last) must answer
# 200 with FILE's bytes.
t_get() {
    local name=$1 file=$2 out=$topo/out code
    shift 2
    if ! code=$(curl -sS --max-time 30 -o "$out" -w '%{http_code}' "$@"); then
        lab_check_alive
        lab_die "$name: curl $* failed"
    fi
    lab_check_alive
    [[ $code == 200 ]] || lab_die "$name: status $code for curl $*: $(head -c 300 "$out")"
    cmp -s "$out" "$file" ||
        lab_die "$name: wrong bytes: got $(lab_size "$out") B, want $(lab_size "$file") B ($(cmp "$out" "$file" 2>&1 | head -n 1))"
}

# t_fetch NAME FILE PROXY CURL_ARGS...: t_get, and what PROXY (the client
# proxy curl talks to) counted for it once it has counted FILE's bytes
# delivered: t_deltas, t_stream (upstream bytes), t_link (and basis
# signatures).
t_fetch() {
    local name=$1 file=$2 proxy=$3 before after
    shift 3
    before=$(lab_stats "$proxy")
    t_get "$name" "$file" "$@"
    lab_wait_field "$proxy" downstream_bytes \
        $(($(lab_field "$before" downstream_bytes) + $(lab_size "$file"))) >/dev/null
    after=$(lab_stats "$proxy")
    t_deltas=$(($(lab_field "$after" deltas) - $(lab_field "$before" deltas)))
    t_stream=$(($(lab_field "$after" upstream_bytes) - $(lab_field "$before" upstream_bytes)))
    t_link=$((t_stream + $(lab_field "$after" signature_bytes) - $(lab_field "$before" signature_bytes)))
    (($(lab_field "$after" digest_failures) == $(lab_field "$before" digest_failures))) ||
        lab_die "$name: a digest failure was counted"
    printf '  %-30s %7d B to curl, link %7d B, deltas %d\n' "$name" "$(lab_size "$file")" "$t_link" "$t_deltas" >&2
}

# small_link NAME FILE: the fetch's link bytes must be under
# MAX_LINK_RATIO of FILE (a delta, not the whole body).
small_link() {
    awk -v l="$t_link" -v s="$(lab_size "$2")" -v m="$max_ratio" 'BEGIN { exit !(l < m * s) }' ||
        lab_die "$1: $t_link link bytes for a $(lab_size "$2") B file, want < $(pct "$max_ratio" 1) %: not a delta"
}

echo "e2e: sites and routes (curl -x $edge_url; accelerators A $accel_a_url, B $accel_b_url):" >&2
# The user agent claims to be forwarding for someone: the edge client
# proxy (trusting no user agent) replaces that with curl's own address;
# A (trusting no one) replaces it again, B (trusting loopback) appends.
forged=(-H 'Forwarded: for=203.0.113.9' -H 'X-Forwarded-For: 203.0.113.9')
coded_a=$(counter "$accel_a_url" coded) coded_b=$(counter "$accel_b_url" coded)
t_fetch "a.test jquery $old_ver" "$old" "$edge_url" -x "$edge_url" "${forged[@]}" "http://a.test/jquery/$old_ver/jquery.js"
want_counter "a.test v1" "$accel_a_url" coded $((coded_a + 1))
t_fetch "a.test jquery $new_ver" "$new" "$edge_url" -x "$edge_url" "${forged[@]}" "http://a.test/jquery/$new_ver/jquery.js"
((t_deltas == 1)) || lab_die "a.test v2: edge deltas went up by $t_deltas, want 1"
want_counter "a.test v2" "$accel_a_url" coded $((coded_a + 2))
small_link "a.test v2" "$new"
a_link=$t_link
want_counter "a.test" "$accel_b_url" coded "$coded_b"

b1=$sites/b/notes/1/notes.txt b2=$sites/b/notes/2/notes.txt
t_fetch "b.test notes 1" "$b1" "$edge_url" -x "$edge_url" "${forged[@]}" http://b.test/notes/1/notes.txt
want_counter "b.test v1" "$accel_b_url" coded $((coded_b + 1))
t_fetch "b.test notes 2" "$b2" "$edge_url" -x "$edge_url" "${forged[@]}" http://b.test/notes/2/notes.txt
((t_deltas == 1)) || lab_die "b.test v2: edge deltas went up by $t_deltas, want 1"
want_counter "b.test v2" "$accel_b_url" coded $((coded_b + 2))
small_link "b.test v2" "$b2"
b_link=$t_link
want_counter "b.test" "$accel_a_url" coded $((coded_a + 2))

# c.test: direct, and nginx speaks no hsync: both versions come whole.
c1=$sites/c/notes/1/notes.txt c2=$sites/c/notes/2/notes.txt
t_fetch "c.test notes 1 (direct)" "$c1" "$edge_url" -x "$edge_url" "http://127.0.0.1:$c_port/notes/1/notes.txt"
((t_deltas == 0)) || lab_die "c.test v1: edge deltas went up by $t_deltas, want 0 (direct to nginx)"
t_fetch "c.test notes 2 (direct)" "$c2" "$edge_url" -x "$edge_url" "http://127.0.0.1:$c_port/notes/2/notes.txt"
((t_deltas == 0)) || lab_die "c.test v2: edge deltas went up by $t_deltas, want 0 (direct to nginx)"
((t_stream >= $(lab_size "$c2"))) ||
    lab_die "c.test v2: $t_stream B came upstream for a $(lab_size "$c2") B file, want the whole body"
c_stream=$t_stream
want_counter "c.test" "$accel_a_url" coded $((coded_a + 2))
want_counter "c.test" "$accel_b_url" coded $((coded_b + 2))

# What nginx was told. Its log writes `"` as \x22; undo that.
nginx_lines() {
    sed 's/\\x22/"/g' "$lab_tmp/logs/nginx-access.log" | grep -F "$1" || true
}
a_line=$(nginx_lines "GET /jquery/$new_ver/jquery.js HTTP/1.1\" 200" | grep -F 'host="a.test"' | tail -n 1)
[[ -n $a_line ]] || lab_die "nginx logged no 200 for a.test's /jquery/$new_ver/jquery.js"
[[ $a_line == *'fwd="for=127.0.0.1;host="a.test";proto=http"'* && $a_line == *'xff="127.0.0.1"'* ]] ||
    lab_die "a.test: accelerator A (trusting no forwarder) must send Forwarded: for=127.0.0.1;host=\"a.test\";proto=http and X-Forwarded-For: 127.0.0.1 only; nginx logged: $a_line"
b_line=$(nginx_lines "GET /notes/2/notes.txt HTTP/1.1\" 200" | grep -F 'host="b.test"' | tail -n 1)
[[ -n $b_line ]] || lab_die "nginx logged no 200 for b.test's /notes/2/notes.txt"
[[ $b_line == *'fwd="for=127.0.0.1;host="b.test";proto=http, for=127.0.0.1;host="b.test";proto=http"'* && $b_line == *'xff="127.0.0.1, 127.0.0.1"'* ]] ||
    lab_die "b.test: the edge must replace curl's made-up Forwarded with curl's address, and accelerator B (trusting loopback) append to it; nginx logged: $b_line"
c_line=$(nginx_lines "GET /notes/2/notes.txt HTTP/1.1\" 200" | grep -F "host=\"127.0.0.1:$c_port\"" | tail -n 1)
[[ -n $c_line && $c_line == *"via=\"1.1 127.0.0.1:$edge_port"* ]] ||
    lab_die "c.test: nginx logged no request from the edge client proxy ($c_line)"

echo "e2e: a CONNECT tunnel (curl -x $edge_url https://localhost:$tls_port/):" >&2
tunnels=$(counter "$edge_url" tunnels)
t_get "https via CONNECT" "$new" -x "$edge_url" --cacert "$tls_dir/cert.pem" \
    "https://localhost:$tls_port/jquery/$new_ver/jquery.js"
want_counter "https via CONNECT" "$edge_url" tunnels $((tunnels + 1))
tunnel_bytes=$(lab_wait_field "$edge_url" tunnel_bytes "$(lab_size "$new")")
((tunnel_bytes >= $(lab_size "$new"))) || lab_die "https via CONNECT: the edge counted $tunnel_bytes tunnel bytes"
printf '  %-30s %7d B to curl, tunnel %d B\n' "https via CONNECT" "$(lab_size "$new")" "$tunnel_bytes" >&2

echo "e2e: a parent-mode accelerator ($parent_url, routed localhost):" >&2
coded_p=$(counter "$parent_url" coded)
t_fetch "parent jquery $old_ver" "$old" "$edge_url" -x "$edge_url" "http://localhost:$nginx_port/jquery/$old_ver/jquery.js"
want_counter "parent v1" "$parent_url" coded $((coded_p + 1))
t_fetch "parent jquery $new_ver" "$new" "$edge_url" -x "$edge_url" "http://localhost:$nginx_port/jquery/$new_ver/jquery.js"
((t_deltas == 1)) || lab_die "parent v2: edge deltas went up by $t_deltas, want 1"
want_counter "parent v2" "$parent_url" coded $((coded_p + 2))
small_link "parent v2" "$new"
parent_link=$t_link
# https:// through the parent: the client proxy only forwards http:// URLs
# (https ones are CONNECTed), so curl asks the parent itself, in absolute
# form; the parent connects with TLS, trusting the test's CA.
t_get "parent https" "$new" --request-target "https://localhost:$tls_port/jquery/$new_ver/jquery.js" "$parent_url/"
p_line=$(nginx_lines "GET /jquery/$new_ver/jquery.js HTTP/1.1\" 200" | grep -F "host=\"localhost:$tls_port\"" | tail -n 1)
[[ $p_line == *"fwd=\"for=127.0.0.1;host=\"localhost:$tls_port\";proto=http\""* ]] ||
    lab_die "parent https: nginx's TLS server logged no request from the parent ($p_line)"
printf '  %-30s %7d B to curl\n' "parent https (absolute-form)" "$(lab_size "$new")" >&2

echo "e2e: a chain (curl -x $outer_url, whose upstream is the edge $edge_url):" >&2
edge_deltas=$(counter "$edge_url" deltas)
t_fetch "chain jquery $old_ver" "$old" "$outer_url" -x "$outer_url" "http://a.test/chain/$old_ver/jquery.js"
t_fetch "chain jquery $new_ver" "$new" "$outer_url" -x "$outer_url" "http://a.test/chain/$new_ver/jquery.js"
((t_deltas == 1)) || lab_die "chain v2: outer deltas went up by $t_deltas, want 1 (the edge codes toward it)"
small_link "chain v2" "$new"
chain_link=$t_link
# The edge took both from A as hsync streams, the second a delta.
want_counter "chain" "$edge_url" deltas $((edge_deltas + 2))
want_counter "chain" "$accel_a_url" coded $((coded_a + 4))

gz=$(gzip -9 -c "$new" | wc -c | tr -d ' ')
cat <<EOF
e2e: PASS
  jquery $old_ver cold:      $(lab_size "$old") B delivered, $old_link B on the hsync link
  jquery $new_ver as delta:  $new_size B delivered, $new_link B on the link (stream $new_stream + basis signature $new_sig)
  link / file size:         $(pct "$new_link" "$new_size") % (limit $(pct "$max_ratio" 1) %)
  link / gzip -9 ($gz B):  $(awk -v l="$new_link" -v g="$gz" 'BEGIN { printf "%.3f", l / g }')
  gateway request:          byte-identical
  repeat request:           ${again_status:-no Cache-Status}
  apt update 1 (cold):      Packages $apt_packages_1 B, $apt1_link B on the link for the whole update
  apt update 2 (delta):     Packages $apt_packages_2 B, $apt2_link B on the link (stream $apt2_stream, $apt2_deltas deltas): $(pct "$apt2_link" "$apt_packages_2") % of Packages
  apt update 3 (unchanged): $apt3_link B on the link
  apt download:             $deb byte-identical
  sites: a.test v2 via A:   $a_link B on the link ($(pct "$a_link" "$new_size") %); Forwarded for=127.0.0.1;host="a.test"
  sites: b.test v2 via B:   $b_link B on the link ($(pct "$b_link" "$(lab_size "$b2")") %); trusted hop's Forwarded appended to
  direct: c.test v2:        $c_stream B upstream, whole ($(lab_size "$c2") B file)
  CONNECT https://:         byte-identical, tunnel $tunnel_bytes B
  parent: http v2 delta:    $parent_link B on the link; https:// origin byte-identical
  chain: outer v2 delta:    $chain_link B on the outer link ($(pct "$chain_link" "$new_size") %)
EOF
