#!/usr/bin/env bash
# Bytes on the wire for rproxy's hsync versus its peers, over the pairs of the
# benchmark corpus (see $CORPUS/README.md and $CORPUS/MANIFEST), in two
# parts.
#
# Part 1, the codec's figures from the command-line tool (no proxies, no
# HTTP heads). For each `kind basis new` line of MANIFEST it measures:
#   gzip9         gzip -9 of new (the reference every ratio is relative to)
#   brotli11      brotli -q 11 of new (if brotli is installed)
#   zstd-patch    zstd -19 --patch-from=basis new (needs the basis at the sender)
#   rdiff+zstd    rdiff signature (default options) + rdiff delta, zstd -19
#   tool:sig+str  stateless (the accelerator has only the signature):
#                 `rproxy hsync stats --basis BASIS NEW`, its `wire=`: the
#                 basis signature as its request header (base64) + the
#                 stream (delta interleaved with the new body's signature)
#   tool:c3+sigh  `wire_known_basis=`: the codec 3 stream (the accelerator
#                 holds the basis body) + that same signature header. The
#                 pair no longer sends the signature when the accelerator
#                 said it keeps the body (hash-only requests), so this is
#                 NOT what the pair sends; see part 2 for that.
#   tool:c3      the codec 3 stream alone (wire_known_basis minus the
#                 signature header): the body of a hash-only exchange,
#                 without any head.
#
# Part 2, through the pair (scripts/bench-corpus-pair.sh, skipped with
# NO_PAIR=1): the `seq` chains served at one URL each by nginx and fetched
# in order through accelerator -> byte-counting relay -> client proxy with
# curl; the link bytes of each update both ways, heads included, beside
# gzip -9 and zstd -19 --patch-from of the same pairs. Its header says
# exactly what is counted.
#
# Usage: scripts/bench-corpus.sh
#   CORPUS=DIR     corpus folder (default: ../shared/corpus from the repo root)
#   NO_RPROXY=1    skip building and running rproxy (peers only; no part 2)
#   NO_PAIR=1      skip part 2 (nginx, the pair and the relay)
#   RPROXY=PATH    use this rproxy binary instead of building the release one
#                  (in $CARGO_TARGET_DIR, default target/)
#   JOBS=N         measurements run at once (default: nproc)
# Needs: gzip, zstd, rdiff; optionally brotli; part 2 also nginx, curl,
# python3.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
corpus=${CORPUS:-$root/../shared/corpus}
if ! corpus=$(cd "$corpus" 2>/dev/null && pwd) || [[ ! -f $corpus/MANIFEST ]]; then
    echo "bench-corpus: no MANIFEST in corpus folder '${CORPUS:-$root/../shared/corpus}' (set CORPUS=...)" >&2
    exit 1
fi
for tool in gzip zstd rdiff; do
    command -v "$tool" >/dev/null || { echo "bench-corpus: $tool not installed" >&2; exit 1; }
done
have_brotli=0
command -v brotli >/dev/null && have_brotli=1

tmp=$(mktemp -d)
trap 'wait; rm -rf "$tmp"' EXIT

# Read and check the pairs first, so a bad line fails before any work starts.
kinds=() bases=() news=()
while read -r kind basis new _; do
    [[ -z ${kind:-} || $kind == \#* ]] && continue
    if [[ -z ${new:-} || ! -f $corpus/$basis || ! -f $corpus/$new ]]; then
        echo "bench-corpus: bad MANIFEST line (missing field or file): $kind $basis ${new:-}" >&2
        exit 1
    fi
    kinds+=("$kind") bases+=("$basis") news+=("$new")
done <"$corpus/MANIFEST"

rproxy=""
if [[ ${NO_RPROXY:-0} == 1 ]]; then
    echo "rproxy: n/a (NO_RPROXY=1)" >&2
elif [[ -n ${RPROXY:-} ]]; then
    rproxy=$RPROXY
elif (cd "$root" && cargo build --release --quiet); then
    rproxy=${CARGO_TARGET_DIR:-$root/target}/release/rproxy
else
    echo "rproxy: n/a (cargo build --release failed)" >&2
fi

size() { wc -c | tr -d ' '; }

# Each measurement below writes one number (or "-" when not available) to
# the file named by its first argument, and nothing if a tool fails (errexit
# applies to these background jobs; pipefail catches the compressor).

# gzip -9 and brotli -q 11 of a file (once per distinct new file).
compress_new() { # OUT_PREFIX FILE
    local gz br=-
    gz=$(gzip -9 -n -c "$2" | size) # -n: no name/mtime header, as in HTTP
    if ((have_brotli)); then br=$(brotli -q 11 -c "$2" | size); fi
    echo "$gz" >"$1.gzip"
    echo "$br" >"$1.brotli"
}

zstd_patch() { # OUT BASIS NEW
    # zstd -19 already fits basis+new in its window below 8 MiB.
    local long=() bytes
    (($(stat -c %s "$2") + $(stat -c %s "$3") > 8 * 1024 * 1024)) && long=(--long=27)
    # -qq also silences its "[Optimal parser notes]" advice on stderr.
    bytes=$(zstd -qq -19 "${long[@]}" -c --patch-from="$2" "$3" | size)
    echo "$bytes" >"$1"
}

rdiff_zstd() { # OUT BASIS NEW
    local delta
    rdiff signature "$2" "$1.sig"
    rdiff delta "$1.sig" "$3" "$1.delta"
    delta=$(zstd -q -19 -c "$1.delta" | size)
    echo $(($(size <"$1.sig") + delta)) >"$1"
}

# The failure reason, if any, goes to $tmp/rproxy.fail.
# Writes three figures: rsync only (the accelerator has just the signature:
# signature header + stream), with the accelerator still holding the basis
# body (codec 3 stream + the same signature header), and that codec 3
# stream alone.
rproxy_wire() { # OUT BASIS NEW
    local out="" wire="" known="" sighdr="" c3=""
    if [[ -z $rproxy ]]; then
        :
    elif out=$("$rproxy" hsync stats --basis "$2" "$3" 2>"$1.err"); then
        wire=$(tr ' ' '\n' <<<"$out" | sed -n 's/^wire=\([0-9][0-9]*\)$/\1/p' | head -n 1)
        known=$(tr ' ' '\n' <<<"$out" | sed -n 's/^wire_known_basis=\([0-9][0-9]*\)$/\1/p' | head -n 1)
        sighdr=$(tr ' ' '\n' <<<"$out" | sed -n 's/^signature_header=\([0-9][0-9]*\)$/\1/p' | head -n 1)
        if [[ -n $known && -n $sighdr ]]; then c3=$((known - sighdr)); fi
        [[ -n $wire ]] || echo "no wire= in output: $out" >>"$tmp/rproxy.fail"
    else
        echo "exit $?: $(head -n 1 "$1.err")" >>"$tmp/rproxy.fail"
    fi
    echo "${wire:--} ${known:--} ${c3:--}" >"$1"
}

# Runs "$@" in the background, at most JOBS at a time. A failed job shows up
# as a missing output file when the rows are collected.
max_jobs=${JOBS:-$(nproc)}
spawn() {
    while (($(jobs -rp | wc -l) >= max_jobs)); do wait -n || true; done
    "$@" &
}

# Distinct new files first (brotli -q 11 is the slowest step), then the pairs.
declare -A new_id=()
for new in "${news[@]}"; do
    [[ -v new_id[$new] ]] && continue
    new_id[$new]=n${#new_id[@]}
    spawn compress_new "$tmp/${new_id[$new]}" "$corpus/$new"
done
for i in "${!kinds[@]}"; do
    spawn zstd_patch "$tmp/p$i.zstd" "$corpus/${bases[i]}" "$corpus/${news[i]}"
    spawn rdiff_zstd "$tmp/p$i.rdiff" "$corpus/${bases[i]}" "$corpus/${news[i]}"
    spawn rproxy_wire "$tmp/p$i.rproxy" "$corpus/${bases[i]}" "$corpus/${news[i]}"
done
wait

# One row per pair: kind basis new newsize gzip9 brotli11 zstd rdiff
# tool:sig+str tool:c3+sigh tool:c3.
for i in "${!kinds[@]}"; do
    n=$tmp/${new_id[${news[i]}]} p=$tmp/p$i
    for f in "$n.gzip" "$n.brotli" "$p.zstd" "$p.rdiff" "$p.rproxy"; do
        [[ -s $f ]] || { echo "bench-corpus: measuring ${news[i]} failed (no ${f##*.} figure; see errors above)" >&2; exit 1; }
    done
    echo "${kinds[i]} ${bases[i]} ${news[i]} $(size <"$corpus/${news[i]}")" \
        "$(<"$n.gzip") $(<"$n.brotli") $(<"$p.zstd") $(<"$p.rdiff") $(<"$p.rproxy")"
done >"$tmp/results"

if [[ -s $tmp/rproxy.fail ]]; then
    echo "rproxy: n/a for $(wc -l <"$tmp/rproxy.fail") pairs; first: $(head -n 1 "$tmp/rproxy.fail")" >&2
fi

# Table, then totals per kind, over seq+cross, and each other kind on its own.
awk -v corpus="$corpus" '
function short(p) { sub(/^public\//, "", p); return p }
function num(v) { return v == "-" ? "n/a" : v }
function ratio(v, g) { return v == "-" ? "n/a" : sprintf("%.3fx", v / g) }
function add(group, i) {
    if ($i == "-" || sum[group, i] == "-") sum[group, i] = "-"
    else sum[group, i] += $i
}
function total(label, group,   g) {
    g = sum[group, 5]
    printf "%-22s %3d pairs  new %9d  gzip9 %8d  |  tool:sig+str %s  tool:c3+sigh %s  tool:c3 %s  zstd-patch %s  rdiff+zstd %s  brotli %s\n",
        label, count[group], sum[group, 4], g, ratio(sum[group, 9], g), ratio(sum[group, 10], g),
        ratio(sum[group, 11], g), ratio(sum[group, 7], g), ratio(sum[group, 8], g), ratio(sum[group, 6], g)
}
BEGIN {
    printf "corpus: %s\n\n", corpus
    printf "part 1: the rproxy hsync tool (no proxies, no HTTP heads); tool:c3+sigh is not what the pair sends\n"
    printf "(hash-only requests carry no signature): part 2 below measures the pair\n\n"
    fmt = "%-9s %-34s %-34s %9s %8s %8s %8s %8s %8s %8s %8s\n"
    printf fmt, "kind", "new", "basis", "new", "gzip9", "brotli11", "zstd-pat", "rdiff+z", "t:sig+st", "t:c3+sgh", "t:c3"
}
{
    printf fmt, $1, short($3), short($2), $4, $5, num($6), num($7), num($8), num($9), num($10), num($11)
    if (!($1 in count)) kinds[++nkinds] = $1
    count[$1]++
    for (i = 4; i <= 11; i++) add($1, i)
    if ($1 == "seq" || $1 == "cross") {
        count["seq+cross"]++
        for (i = 4; i <= 11; i++) add("seq+cross", i)
    }
}
END {
    print "\nbytes on the wire relative to gzip -9 of the new files:"
    for (k = 1; k <= nkinds; k++)
        if (kinds[k] == "seq" || kinds[k] == "cross") total(kinds[k], kinds[k])
    if ("seq+cross" in count) total("seq+cross", "seq+cross")
    for (k = 1; k <= nkinds; k++)
        if (kinds[k] != "seq" && kinds[k] != "cross") total(kinds[k] " (control)", kinds[k])
}' "$tmp/results"

# Part 2: through the pair, with the binary part 1 used.
if [[ ${NO_PAIR:-0} == 1 ]]; then
    echo "bench-corpus: part 2 (through the pair) skipped (NO_PAIR=1)" >&2
elif [[ -z $rproxy ]]; then
    echo "bench-corpus: part 2 (through the pair) skipped: no rproxy binary" >&2
else
    echo
    echo "part 2: through the pair (scripts/bench-corpus-pair.sh)"
    CORPUS=$corpus RPROXY=$rproxy "$root/scripts/bench-corpus-pair.sh"
fi
