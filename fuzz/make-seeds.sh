#!/bin/sh
# Regenerates the committed seeds in fuzz/corpus/ (see README.md, "Seeds").
# Usage: fuzz/make-seeds.sh [path/to/rproxy]   (default: target/release/rproxy,
# built first with `cargo build --release` at the repository root).
set -eu
fuzz=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$fuzz")
rproxy=${1:-$root/target/release/rproxy}
[ -x "$rproxy" ] || (cd "$root" && cargo build --release)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# basis.bin, body.bin, edited.bin, text*.bin, small.bin, big.bin; the differential seeds.
(cd "$fuzz" && cargo run --quiet --release --example fixtures -- "$tmp")

cd "$tmp"
"$rproxy" hsync sign basis.bin -o basis.sig
"$rproxy" hsync sign basis.bin --max-signature 200 -o basis-bigblock.sig
"$rproxy" hsync sign body.bin -o body.sig
"$rproxy" hsync sign text.bin -o text.sig
"$rproxy" hsync sign small.bin -o small.sig
"$rproxy" hsync encode --signature basis.sig edited.bin -o edited.hs
"$rproxy" hsync encode --signature basis.sig --max-signature 300 edited.bin -o edited-bigblock.hs
"$rproxy" hsync encode --signature basis.sig body.bin -o body.hs
"$rproxy" hsync encode small.bin -o small-scratch.hs
"$rproxy" hsync encode text2.bin -o text2-scratch.hs
"$rproxy" hsync encode --signature text.sig text2.bin -o text2-vs-text.hs
"$rproxy" hsync encode big.bin -o big-scratch.hs

c=$fuzz/corpus
mkdir -p "$c/decoder" "$c/frame_parse" "$c/signature"
# decoder: first byte = push size - 1 (octal escapes for printf).
seed() { { printf "$1"; cat "$2"; } > "$c/decoder/$3"; }
seed '\377' edited.hs real-edited-split256
seed '\006' edited.hs real-edited-split7
seed '\077' body.hs real-body-split64
seed '\377' edited-bigblock.hs real-edited-bigblock-split256
seed '\000' small-scratch.hs real-scratch-small-split1
seed '\143' text2-scratch.hs real-scratch-text2-split100
seed '\377' big-scratch.hs over-output-limit-split256
{ printf '\377'; cat edited.hs; printf 'x'; } > "$c/decoder/trailing-after-end-split256"
half=$(( $(wc -c < edited.hs) / 2 ))
{ printf '\377'; head -c "$half" edited.hs; } > "$c/decoder/truncated-edited-split256"
# frame_parse: raw streams.
cp edited.hs "$c/frame_parse/real-edited"
cp small-scratch.hs "$c/frame_parse/real-small-scratch"
cp text2-vs-text.hs "$c/frame_parse/real-text2-vs-text"
head -c 200 edited.hs > "$c/frame_parse/truncated-edited"
# signature: real signatures, one cut inside an entry, a bare header.
for s in basis basis-bigblock body small text; do cp "$s.sig" "$c/signature/real-$s"; done
head -c $((12 + 12 * 20 + 5)) basis.sig > "$c/signature/truncated-mid-entry"
head -c 12 basis.sig > "$c/signature/header-only"
echo "seeds written to $c"
