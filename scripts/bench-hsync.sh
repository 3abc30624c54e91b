#!/usr/bin/env bash
# Speed and peak memory of `rproxy hsync encode` and `decode`, on one core,
# next to peers measured in the same run, against the issue's targets:
#   encode >= 400 MB/s and decode+verify >= 1,000 MB/s for a 64 MiB body with
#   1% edits; peak RSS <= 64 MiB while encoding or decoding a 1 GiB body.
# rproxy runs with its defaults, as the proxies do.
#
# Data: deterministic text from benches/support/textgen.rs (the generator the
# criterion benches use; the 64 MiB pair is byte for byte their
# edited_1pct/64MiB case): a basis, and a new body with 1% of its bytes
# edited in 32 runs (replace, insert, delete) scattered over it.
#
# Part 1, 64 MiB, every command pinned to CPU 0 (taskset -c 0), best of
# REPEAT runs by CPU time (user+sys from wait4, which other load on the
# machine disturbs far less than wall time; both are shown):
#   ours    rproxy hsync sign (basis), encode (new vs the signature; and
#           against the basis body itself, as a kept basis, --basis-body),
#           decode (stream + basis, verified)
#   peers   zstd -3 -T1 (new alone), zstd -3 -T1 --long=27 --patch-from
#           (compress and decompress), rdiff signature + delta (default
#           options) and rdiff patch, and b3sum or else sha256sum (new)
#   floor   cat (new into a file: the read and write any rebuild costs) and
#           the hasher's time, summed: what decode + verify cannot beat
#   issue 20's setting of its speed targets, last: encode against a 1 KiB-
#           block signature and decode its stream, beside rdiff delta and
#           patch with the same blocks and hashes (-H md4 -R rollsum -S 8
#           -b 1024); the rows before use each tool's own defaults.
# MB/s = new body bytes (basis bytes for signatures) / 10^6 / seconds.
#
# Part 2, 1 GiB: peak RSS (/usr/bin/time -v) of sign, encode and decode, of
# the edited body and of an unchanged one (a stream of a few KiB that
# rebuilds the whole body), next to zstd -3 -T1 and rdiff patch.
#
# Usage: scripts/bench-hsync.sh
#   RPROXY=PATH   use this rproxy binary instead of building target/release
#   REPEAT=N      runs per part-1 command (default 3)
#   NO_1G=1       skip part 2
# Needs: cargo + rustc, python3, taskset, zstd, rdiff, GNU time (/usr/bin/time; installed
# with apt-get when missing and allowed). About 3-5 minutes; ~4.5 GB in /tmp.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repeat=${REPEAT:-3}
tmp=$(mktemp -d /tmp/bench-hsync.XXXXXX)
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

die() { echo "bench-hsync: $*" >&2; exit 1; }

for tool in taskset zstd rdiff rustc python3; do
    command -v "$tool" >/dev/null || die "$tool not installed"
done
if [[ ! -x /usr/bin/time ]]; then
    echo "bench-hsync: installing GNU time (apt-get install time)" >&2
    sudo=()
    ((EUID == 0)) || sudo=(sudo)
    "${sudo[@]}" apt-get install -y -qq time >/dev/null 2>&1 ||
        { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq time >/dev/null; } ||
        die "/usr/bin/time missing and apt-get install time failed"
fi
if command -v b3sum >/dev/null; then
    hasher=(b3sum --num-threads 1) hasher_name="b3sum -1"
else
    hasher=(sha256sum) hasher_name=sha256sum
fi

if [[ -n ${RPROXY:-} ]]; then
    rproxy=$RPROXY
else
    (cd "$root" && cargo build --release --quiet) || die "cargo build --release failed"
    rproxy=$root/target/release/rproxy
fi

# The generator: benches/support/textgen.rs with a main around it.
cat >"$tmp/gen.rs" <<EOF
#[path = "$root/benches/support/textgen.rs"]
mod textgen;

/// textgen LEN BASIS NEW: writes LEN bytes of basis text and a 1%-edited copy
/// (the seeds of benches/hsync.rs).
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let len: usize = args[1].parse().expect("LEN is a number");
    let basis = textgen::text(len, 1);
    std::fs::write(&args[2], &basis).expect("write BASIS");
    std::fs::write(&args[3], textgen::edit(&basis, 1, 2)).expect("write NEW");
}
EOF
rustc -O --edition 2021 "$tmp/gen.rs" -o "$tmp/gen" || die "cannot compile the text generator"

size() { stat -c %s "$1"; }

# Part 1 times with wait4() through Python: GNU time prints CPU seconds with
# two decimals, too coarse for runs of 0.05-0.2 s; wait4 gives microseconds.
cat >"$tmp/run.py" <<'EOF'
import os, sys, time
out, err, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
    try:
        os.execvp(cmd[0], cmd)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
print(f"{wall:.6f} {usage.ru_utime + usage.ru_stime:.6f} {usage.ru_maxrss}")
sys.exit(os.waitstatus_to_exitcode(status))
EOF

# measure NAME OUT CMD...: runs CMD on CPU 0, its stdout to OUT; appends
# "NAME wall_s cpu_s maxrss_kib" to $tmp/runs.
measure() {
    local name=$1 out=$2 t
    shift 2
    if ! t=$(taskset -c 0 python3 "$tmp/run.py" "$out" "$tmp/$name.err" "$@"); then
        cat "$tmp/$name.err" >&2
        die "$name failed: $*"
    fi
    echo "$name $t" >>"$tmp/runs"
}

# measure_rss NAME OUT CMD...: the same under GNU time -v (peak RSS).
measure_rss() {
    local name=$1 out=$2
    shift 2
    if ! taskset -c 0 /usr/bin/time -v -o "$tmp/time.txt" "$@" >"$out" 2>"$tmp/$name.err"; then
        cat "$tmp/$name.err" >&2
        die "$name failed: $*"
    fi
    awk -v name="$name" -F': ' '
        /User time/ { cpu += $2 }
        /System time/ { cpu += $2 }
        /Maximum resident set size/ { rss = $2 }
        /Elapsed \(wall clock\)/ {
            n = split($2, p, ":"); wall = 0
            for (i = 1; i <= n; i++) wall = wall * 60 + p[i]
        }
        END { printf "%s %.3f %.3f %d\n", name, wall, cpu, rss }
    ' "$tmp/time.txt" >>"$tmp/runs"
}

# best NAME: the run of NAME with the least CPU time: "wall cpu rss".
best() {
    awk -v name="$1" '$1 == name && (!seen || $3 < cpu) { seen = 1; wall = $2; cpu = $3; rss = $4 }
        END { if (!seen) exit 1; print wall, cpu, rss }' "$tmp/runs"
}

: >"$tmp/runs"
mib64=$((64 << 20))
echo "generating 64 MiB basis and 1%-edited new body ..." >&2
"$tmp/gen" "$mib64" "$tmp/basis" "$tmp/new"
new_bytes=$(size "$tmp/new") basis_bytes=$(size "$tmp/basis")

# Issue 20's own setting of the speed targets: a 1 KiB-block signature on
# both sides, rdiff with the same hashes (md4, rollsum, 8-byte strong sums,
# -b 1024), so that both match the same blocks. The rows above use each
# tool's default (the proxies' 4.6 KB signature budget; rdiff's -b 2048).
sig_1k_budget=$(((basis_bytes + 1023) / 1024 * 12 + 12))
"$rproxy" hsync sign --max-signature "$sig_1k_budget" "$tmp/basis" -o "$tmp/sig1k"
rdiff -H md4 -R rollsum -S 8 -b 1024 signature "$tmp/basis" "$tmp/rsig1k"
cmp -s "$tmp/sig1k" "$tmp/rsig1k" || die "the 1 KiB-block signatures differ"

echo "measuring, $repeat runs each, on CPU 0 ..." >&2
for ((i = 0; i < repeat; i++)); do
    measure encode_1k /dev/null "$rproxy" hsync encode --signature "$tmp/sig1k" "$tmp/new" -o "$tmp/stream1k"
    measure decode_1k "$tmp/out" "$rproxy" hsync decode --basis "$tmp/basis" "$tmp/stream1k"
    cmp -s "$tmp/out" "$tmp/new" || die "hsync decode (1 KiB blocks) did not rebuild the new body"
    measure rdiff_delta_1k /dev/null rdiff -f delta "$tmp/rsig1k" "$tmp/new" "$tmp/delta1k"
    measure rdiff_patch_1k /dev/null rdiff -f patch "$tmp/basis" "$tmp/delta1k" "$tmp/out"
    cmp -s "$tmp/out" "$tmp/new" || die "rdiff patch (1 KiB blocks) did not rebuild the new body"
    measure sign "$tmp/sig" "$rproxy" hsync sign "$tmp/basis"
    measure encode /dev/null "$rproxy" hsync encode --signature "$tmp/sig" "$tmp/new" -o "$tmp/stream"
    measure decode "$tmp/out" "$rproxy" hsync decode --basis "$tmp/basis" "$tmp/stream"
    cmp -s "$tmp/out" "$tmp/new" || die "hsync decode did not rebuild the new body"
    # Against a basis the accelerator kept (codec 3), the case zstd
    # --patch-from is the peer of.
    measure encode_kept /dev/null "$rproxy" hsync encode --basis-body "$tmp/basis" "$tmp/new" -o "$tmp/stream3"
    measure decode_kept "$tmp/out" "$rproxy" hsync decode --basis "$tmp/basis" "$tmp/stream3"
    cmp -s "$tmp/out" "$tmp/new" || die "hsync decode (kept basis) did not rebuild the new body"
    measure zstd3 "$tmp/new.zst" zstd -q -3 -T1 -c "$tmp/new"
    measure zstd3_d /dev/null zstd -q -d -c "$tmp/new.zst"
    measure patch_from /dev/null zstd -q -3 -T1 --long=27 --patch-from="$tmp/basis" "$tmp/new" -f -o "$tmp/patch.zst"
    measure patch_from_d /dev/null zstd -q -d -T1 --long=27 --patch-from="$tmp/basis" "$tmp/patch.zst" -f -o "$tmp/out"
    cmp -s "$tmp/out" "$tmp/new" || die "zstd --patch-from did not rebuild the new body"
    measure rdiff_sig /dev/null rdiff -f signature "$tmp/basis" "$tmp/rsig"
    measure rdiff_delta /dev/null rdiff -f delta "$tmp/rsig" "$tmp/new" "$tmp/delta"
    measure rdiff_patch /dev/null rdiff -f patch "$tmp/basis" "$tmp/delta" "$tmp/out"
    cmp -s "$tmp/out" "$tmp/new" || die "rdiff patch did not rebuild the new body"
    measure hash /dev/null "${hasher[@]}" "$tmp/new"
    # The copy alone, into a file as decode's stdout: read + write.
    measure copy "$tmp/out" cat "$tmp/new"
done

# One table row: label, bytes the MB/s is over, wire bytes or "-", run name.
row() {
    local t
    t=$(best "$4")
    awk -v label="$1" -v bytes="$2" -v wire="$3" -v t="$t" 'BEGIN {
        split(t, v, " ")
        printf "%-34s %8.3f %8.3f %9.0f %9.0f %8.1f %9s\n", label, v[1], v[2],
            bytes / 1e6 / v[1], bytes / 1e6 / v[2], v[3] / 1024, wire
    }'
}
mbps() { # RUN BYTES: MB/s by CPU time
    best "$1" | awk -v bytes="$2" '{ printf "%.1f", bytes / 1e6 / $2 }'
}

echo
echo "64 MiB text, 1% edited (new $new_bytes B, basis $basis_bytes B); CPU 0; best of $repeat by CPU time"
printf "%-34s %8s %8s %9s %9s %8s %9s\n" "command" "wall s" "cpu s" "MB/s wall" "MB/s cpu" "RSS MiB" "wire B"
row "rproxy hsync sign (basis)" "$basis_bytes" "$(size "$tmp/sig")" sign
row "rproxy hsync encode" "$new_bytes" "$(size "$tmp/stream")" encode
row "rproxy hsync decode (verified)" "$new_bytes" - decode
row "rproxy hsync encode --basis-body" "$new_bytes" "$(size "$tmp/stream3")" encode_kept
row "rproxy hsync decode (kept basis)" "$new_bytes" - decode_kept
row "zstd -3 -T1 (new alone)" "$new_bytes" "$(size "$tmp/new.zst")" zstd3
row "zstd -d (of the above)" "$new_bytes" - zstd3_d
row "zstd -3 --long=27 --patch-from" "$new_bytes" "$(size "$tmp/patch.zst")" patch_from
row "zstd -d --patch-from" "$new_bytes" - patch_from_d
row "rdiff signature (basis)" "$basis_bytes" "$(size "$tmp/rsig")" rdiff_sig
row "rdiff delta" "$new_bytes" "$(size "$tmp/delta")" rdiff_delta
row "rdiff patch" "$new_bytes" - rdiff_patch
row "$hasher_name (new)" "$new_bytes" - hash
echo "rproxy: $(cat "$tmp/encode.err")"

# rdiff signature + delta as one encode: both over their own input sizes.
rdiff_sd=$(awk -v s="$(best rdiff_sig)" -v d="$(best rdiff_delta)" -v bytes="$new_bytes" \
    'BEGIN { split(s, a, " "); split(d, b, " "); printf "%.1f", bytes / 1e6 / (a[2] + b[2]) }')
enc=$(mbps encode "$new_bytes") dec=$(mbps decode "$new_bytes")
enc3=$(mbps encode_kept "$new_bytes") dec3=$(mbps decode_kept "$new_bytes")
echo
echo "ratios (MB/s by CPU time; >1 means rproxy is faster or meets the target):"
awk -v enc="$enc" -v dec="$dec" -v z3="$(mbps zstd3 "$new_bytes")" \
    -v z3d="$(mbps zstd3_d "$new_bytes")" -v pf="$(mbps patch_from "$new_bytes")" \
    -v pfd="$(mbps patch_from_d "$new_bytes")" -v rsd="$rdiff_sd" \
    -v rd="$(mbps rdiff_delta "$new_bytes")" -v rp="$(mbps rdiff_patch "$new_bytes")" \
    -v h="$(mbps hash "$new_bytes")" -v hname="$hasher_name" -v enc3="$enc3" -v dec3="$dec3" 'BEGIN {
    f = "  %-15s %8.1f MB/s  %-30s %8.1f MB/s  ratio %6.3fx\n"
    printf f, "encode", enc, "target", 400, enc / 400
    printf f, "encode", enc, "zstd -3 -T1", z3, enc / z3
    printf f, "encode", enc, "zstd -3 --patch-from", pf, enc / pf
    printf f, "encode", enc, "rdiff signature + delta", rsd, enc / rsd
    printf f, "encode", enc, "rdiff delta", rd, enc / rd
    printf f, "decode+verify", dec, "target", 1000, dec / 1000
    printf f, "decode+verify", dec, "zstd -d", z3d, dec / z3d
    printf f, "decode+verify", dec, "zstd -d --patch-from", pfd, dec / pfd
    printf f, "decode+verify", dec, "rdiff patch", rp, dec / rp
    printf f, "decode+verify", dec, hname, h, dec / h
    printf f, "encode (kept)", enc3, "target", 400, enc3 / 400
    printf f, "encode (kept)", enc3, "zstd -3 --patch-from", pf, enc3 / pf
    printf f, "decode (kept)", dec3, "zstd -d --patch-from", pfd, dec3 / pfd
}'
echo
echo "issue 20's speed targets as it states them (1 KiB-block signature, rdiff -b 1024, same hashes):"
awk -v enc="$(mbps encode_1k "$new_bytes")" -v dec="$(mbps decode_1k "$new_bytes")" \
    -v rd="$(mbps rdiff_delta_1k "$new_bytes")" -v rp="$(mbps rdiff_patch_1k "$new_bytes")" 'BEGIN {
    f = "  %-15s %8.1f MB/s  %-30s %8.1f MB/s  ratio %6.3fx  target %s\n"
    printf f, "encode", enc, "rdiff delta -b 1024", rd, enc / rd, ">= 1.5x"
    printf f, "decode+verify", dec, "rdiff patch -b 1024", rp, dec / rp, ">= 1.2x"
}'
# What any verified rebuild costs at least: the bytes read and written once
# (cat into a file) and hashed once with blake3 (b3sum), nothing else.
[[ $hasher_name == "b3sum -1" ]] || echo "  floor of decode+verify: needs b3sum (apt-get install b3sum)"
[[ $hasher_name != "b3sum -1" ]] || awk -v c="$(best copy)" -v h="$(best hash)" -v rp="$(mbps rdiff_patch_1k "$new_bytes")" \
    -v bytes="$new_bytes" -v hname="$hasher_name" 'BEGIN {
    split(c, a, " "); split(h, b, " "); floor = bytes / 1e6 / (a[2] + b[2])
    printf "  floor of decode+verify: cat into a file + %s, %.1f MB/s = %.3fx rdiff patch -b 1024\n",
        hname, floor, floor / rp
}'
rm -f "$tmp"/{basis,new,out,stream,stream3,stream1k,new.zst,patch.zst,delta,delta1k,rsig,rsig1k,sig,sig1k}

if [[ ${NO_1G:-0} == 1 ]]; then
    echo
    echo "peak RSS at 1 GiB: skipped (NO_1G=1)"
    exit 0
fi

gib=$((1 << 30))
echo >&2
echo "generating 1 GiB basis and 1%-edited new body in $tmp ..." >&2
"$tmp/gen" "$gib" "$tmp/basis" "$tmp/new"
new_bytes=$(size "$tmp/new")
echo "measuring peak RSS, one run each ..." >&2
measure_rss g_sign "$tmp/sig" "$rproxy" hsync sign "$tmp/basis"
measure_rss g_encode /dev/null "$rproxy" hsync encode --signature "$tmp/sig" "$tmp/new" -o "$tmp/stream"
measure_rss g_decode /dev/null "$rproxy" hsync decode --basis "$tmp/basis" "$tmp/stream"
# An unchanged body: a stream of a few KiB that rebuilds the whole GiB.
measure_rss g_encode_same /dev/null "$rproxy" hsync encode --signature "$tmp/sig" "$tmp/basis" -o "$tmp/stream_same"
measure_rss g_decode_same /dev/null "$rproxy" hsync decode --basis "$tmp/basis" "$tmp/stream_same"
measure_rss g_zstd3 /dev/null zstd -q -3 -T1 -c "$tmp/new"
rdiff -f signature "$tmp/basis" "$tmp/rsig"
rdiff -f delta "$tmp/rsig" "$tmp/new" "$tmp/delta"
measure_rss g_rdiff_patch /dev/null rdiff patch "$tmp/basis" "$tmp/delta"

echo
echo "1 GiB text, 1% edited (new $new_bytes B; stream $(size "$tmp/stream") B), and unchanged"
echo "(stream $(size "$tmp/stream_same") B); one run each on CPU 0, peak RSS by GNU time -v"
printf "%-32s %10s %8s %8s %9s %8s\n" "command" "peak RSS" "vs 64MiB" "wall s" "MB/s cpu" "target"
grow() { # LABEL RUN IS_OURS (MB/s over the edited new body's size)
    local t
    t=$(best "$2")
    awk -v label="$1" -v t="$t" -v bytes="$new_bytes" -v ours="$3" 'BEGIN {
        split(t, v, " "); mib = v[3] / 1024
        verdict = ours ? (mib <= 64 ? "met" : "MISSED") : "(peer)"
        printf "%-32s %6.1f MiB %7.2fx %8.2f %9.0f %8s\n", label, mib, mib / 64, v[1],
            bytes / 1e6 / v[2], verdict
    }'
}
grow "rproxy hsync sign (basis)" g_sign 0
grow "rproxy hsync encode" g_encode 1
grow "rproxy hsync decode (verified)" g_decode 1
grow "rproxy hsync encode, unchanged" g_encode_same 1
grow "rproxy hsync decode, unchanged" g_decode_same 1
grow "zstd -3 -T1 (new alone)" g_zstd3 0
grow "rdiff patch" g_rdiff_patch 0
echo "rproxy: $(cat "$tmp/g_encode.err")"
echo "(\"vs 64MiB\" is peak RSS / the 64 MiB target; sign runs on the client and has no target of its own.)"
