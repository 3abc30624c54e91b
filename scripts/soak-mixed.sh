#!/usr/bin/env bash
# Soak under a steady mixed load, row L-11 of RELIABILITY.md: an hour of
# hits, deltas and whole new bodies through the pair at a fixed rate, then
# minutes with no traffic, both proxies sampled every minute. A manual
# benchmark: CI does not run it.
#
#   soak.py mixed ──► rproxy client (cache) ══ hsync ══► rproxy accelerator ──► nginx origin
#
# Everything on 127.0.0.1, release binary, default flags but one: the
# client proxy's --cache-size (below).
#
# The load (`soak.py mixed`), RATE requests a second at fixed times over
# CONNS keep-alive connections (absolute URLs, as to a forward proxy),
# each request picked at random:
#   80 % hits    hot/: HOT_FILES (200) texts of 2-50 KB, Cache-Control
#                max-age=86400: the client proxy serves them from its cache
#                after the first fetch of each;
#   15 % deltas  delta/: DELTA_FILES (20) texts of 10-100 KB, no-cache;
#                just before each request for one, the generator edits it
#                in nginx's root (a line changed, inserted or deleted at a
#                random place; a new mtime each, so nginx's ETag changes),
#                so the client proxy revalidates, gets a changed 200, and
#                the accelerator codes it against the version the client
#                holds;
#   5 % full     full/: a fresh body of 50-500 KB of random base64 at a
#                name never used before (max-age=86400: it is stored, and
#                fills the cache), removed from the root once answered.
# Every body is compared with the file, every status counted. Then IDLE
# minutes with no request at all (the generator's connections closed).
#
# Every SAMPLE seconds, and once before the first request (the baseline):
# per proxy VmRSS, open fds (/proc/PID/fd) and threads, and both proxies'
# /.rproxy/stats (the client proxy's hits, misses, deltas per interval show
# the mix as it happened; its cache_bytes also every 5 s). Printed at the
# end, each with "met" / "NOT met":
#   RSS drift      from the sample at minute WARMUP to the last one under
#                  load, per proxy: <= 5 %
#   FDs            after IDLE against the baseline, per proxy: +- 10
#   panics         `grep -c panicked` over both proxies' logs: 0
#   5xx            answers with a 5xx status: 0
#   cache          cache_bytes <= cache_budget at every sample (C-V1)
# The exit status is non-zero only when the setup failed (build, start-up,
# a proxy died, the generator failed), not when a target is missed.
#
# --cache-size: the full bodies fill the cache (about RATE x 5 % x 275 KB a
# second, 41 MB a minute at 50 requests/s). Unless CACHE_SIZE is given, the
# budget is what they bring in WARMUP/2 minutes (196 MiB for the defaults,
# 32 MiB at least), so the cache is full and evicting before minute WARMUP:
# the RSS drift is measured in the steady state, and C-V1 is checked while
# eviction runs rather than against a budget never reached.
#
# Usage: scripts/soak-mixed.sh          (about MINUTES + IDLE + 1 minutes)
#   MINUTES=60     minutes under load
#   WARMUP=10      the minute the RSS drift is measured from
#   IDLE=5         minutes with no traffic after the load
#   RATE=50        requests a second        CONNS=8     keep-alive connections
#   SAMPLE=60      seconds between samples
#   HOT_FILES=200  DELTA_FILES=20  SEED=11
#   CACHE_SIZE     the client proxy's --cache-size (default: see above)
#   RPROXY, NGINX, CARGO_TARGET_DIR, KEEP_TMP, ACCEL_ARGS, CLIENT_ARGS: see
#   scripts/lib-nginx.sh
# A short run to check the script itself: MINUTES=6 WARMUP=2 IDLE=1.
# Needs: python3 (>= 3.8), nginx, curl.
set -euo pipefail

# shellcheck source=scripts/lib-nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib-nginx.sh"
lab_init soak-mixed

minutes=${MINUTES:-60}
warmup=${WARMUP:-10}
idle=${IDLE:-5}
rate=${RATE:-50}
conns=${CONNS:-8}
sample=${SAMPLE:-60}
hot_files=${HOT_FILES:-200}
delta_files=${DELTA_FILES:-20}
seed=${SEED:-11}

command -v python3 >/dev/null || lab_die "python3 is not installed"
awk -v m="$minutes" -v w="$warmup" 'BEGIN { exit !(w > 0 && w < m) }' ||
    lab_die "WARMUP ($warmup) must be above 0 and below MINUTES ($minutes)"
if [[ -z ${CACHE_SIZE:-} ]]; then
    CACHE_SIZE=$(awk -v r="$rate" -v w="$warmup" \
        'BEGIN { m = int(r * 0.05 * 275000 * 60 * w / 2 / 1048576); print (m < 32 ? 32 : m) "M" }')
fi
export CACHE_SIZE

lab_build

root=$lab_tmp/www
mkdir -p "$root"
NGINX_ACCESS_LOG=off lab_start_nginx "$root" '
        location /hot/ { add_header Cache-Control "max-age=86400" always; }
        location /delta/ { add_header Cache-Control "no-cache" always; }
        location /full/ { add_header Cache-Control "max-age=86400" always; }'
lab_start_pair

stats=$(lab_stats "$lab_client_url")
budget=$(lab_field "$stats" cache_budget)
echo "rproxy soak, mixed load (L-11): $(nproc) cores, $(free -m | awk '/^Mem:/ { print $2 }') MiB RAM;" \
    "release binary $lab_rproxy, default flags but the client's --cache-size $CACHE_SIZE ($budget B)"
lab_log "$minutes min at $rate requests/s (80 % hits, 15 % deltas, 5 % full) over $conns connections," \
    "then $idle min idle; a sample every $sample s"

python3 "$lab_repo/scripts/soak.py" mixed --port "$lab_client_port" --origin "$lab_nginx_url" \
    --root "$root" --client-stats "$lab_client_url" --accel-stats "$lab_accel_url" \
    --pid "accelerator=$lab_accel_pid" --pid "client=$lab_client_pid" \
    --rate "$rate" --conns "$conns" --minutes "$minutes" --idle "$idle" --sample "$sample" \
    --hot-files "$hot_files" --delta-files "$delta_files" --seed "$seed" \
    >"$lab_tmp/mixed.json" || {
    status=$?
    lab_show_logs
    lab_die "the load generator failed (exit status $status; above 128: killed by signal $((status - 128)))"
}

panics_accel=$(grep -c panicked "$lab_tmp/logs/accelerator.log" || true)
panics_client=$(grep -c panicked "$lab_tmp/logs/client.log" || true)

# ---- report ----------------------------------------------------------------------
python3 - "$lab_tmp/mixed.json" "$warmup" "$minutes" "$idle" "$panics_accel" "$panics_client" <<'EOF'
import json, sys
path, warmup, minutes, idle = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
panics = {"accelerator": int(sys.argv[5]), "client": int(sys.argv[6])}
r = json.load(open(path))
samples, total, cache, cfg = r["samples"], r["total"], r["cache"], r["config"]
procs = ["accelerator", "client"]
names = {"accelerator": "accelerator", "client": "client proxy"}
mib = lambda kib: kib / 1024
def met(ok): return "met" if ok else "NOT met"

print(f"\nL-11 soak: {minutes:g} min at {cfg['rate']:g} requests/s over {cfg['conns']} keep-alive connections "
      f"(mix {cfg['mix'][0]:g}/{cfg['mix'][1]:g}/{cfg['mix'][2]:g} % hot/delta/full), then {idle:g} min idle")
print("per interval: requests sent by kind; the client proxy's counters (hits, misses, deltas = hsync "
      "answers, own = a delta against the URL's own entry); RSS in MiB, fds, threads; cache MiB")
print(f"{'min':>5} {'phase':<5} {'hot':>5} {'delta':>5} {'full':>4} {'5xx':>3} {'bad':>3} | "
      f"{'hits':>5} {'miss':>5} {'delta':>5} {'own':>5} | {'acc RSS':>7} {'fds':>4} {'thr':>3} | "
      f"{'cli RSS':>7} {'fds':>4} {'thr':>3} | {'cache':>6}")
prev = None
for s in samples:
    g, c = s["gen"], s["client"] or {}
    d = {k: c.get(k, 0) - (prev or {}).get(k, 0) for k in ("hits", "misses", "deltas", "basis_same_url")}
    bad = sum(g["statuses"].values()) + g["wrong"] + g["failed"]
    a, b = s["procs"]["accelerator"], s["procs"]["client"]
    print(f"{s['t'] / 60:5.1f} {s['phase'][:5]:<5} {g['sent']['hot']:5} {g['sent']['delta']:5} {g['sent']['full']:4} "
          f"{g['five_xx']:3} {bad:3} | {d['hits']:5} {d['misses']:5} {d['deltas']:5} {d['basis_same_url']:5} | "
          f"{mib(a['rss_kib']):7.1f} {a['fds']:4} {a['threads']:3} | {mib(b['rss_kib']):7.1f} {b['fds']:4} "
          f"{b['threads']:3} | {c.get('cache_bytes', 0) / 1048576:6.1f}")
    prev = c

sent = total["sent"]
n = sum(sent.values())
first, last = samples[0]["client"] or {}, samples[-1]["client"] or {}
cd = {k: last.get(k, 0) - first.get(k, 0) for k in
      ("requests", "hits", "misses", "deltas", "basis_same_url", "basis_prefix", "basis_none", "cache_evictions")}
acc0, acc1 = samples[0]["accel"] or {}, samples[-1]["accel"] or {}
print(f"\nsent {n}: hot {sent['hot']} ({100 * sent['hot'] / max(n, 1):.1f} %), delta {sent['delta']} "
      f"({100 * sent['delta'] / max(n, 1):.1f} %), full {sent['full']} ({100 * sent['full'] / max(n, 1):.1f} %); "
      f"Cache-Status hit on {total['cache_hit']['hot']} of {total['ok']['hot']} hot answers")
print(f"client proxy: requests {cd['requests']}, hits {cd['hits']} ({100 * cd['hits'] / max(cd['requests'], 1):.1f} %), "
      f"misses {cd['misses']}, deltas {cd['deltas']} ({100 * cd['deltas'] / max(cd['requests'], 1):.1f} %; "
      f"basis: own URL {cd['basis_same_url']} = {100 * cd['basis_same_url'] / max(cd['requests'], 1):.1f} %, "
      f"another URL {cd['basis_prefix']}, none {cd['basis_none']}), evictions {cd['cache_evictions']}; "
      f"accelerator: coded {acc1.get('coded', 0) - acc0.get('coded', 0)}, passed {acc1.get('passed', 0) - acc0.get('passed', 0)}")
p = lambda kind, q: total[f"p{q}_ms"][kind]
print("latency p50 / p99 ms: " + ", ".join(
    f"{k} {p(k, 50)} / {p(k, 99)}" for k in ("hot", "delta", "full") if p(k, 50) is not None)
    + f"; start lag p99 {total['lag_p99_ms']} ms, max {total['lag_max_ms']} ms; backlog at the end {r['backlog_at_end']}")
odd = sum(total["statuses"].values()) - total["five_xx"]
print(f"answers: 5xx {total['five_xx']}, other non-200 {odd} {total['statuses'] or ''}, wrong body {total['wrong']}, "
      f"failed {total['failed']}, keep-alive retries {total['reconnects']}"
      + (f"; first: {total['first_error']}" if total["first_error"] else ""))

# The targets.
load = [s for s in samples if s["phase"] == "load"]
warm = min(load, key=lambda s: abs(s["t"] - warmup * 60))
end = load[-1]
base, after = samples[0], samples[-1]
print(f"\nL-11 targets ({warm['t'] / 60:.1f} = minute {warmup:g}, {end['t'] / 60:.1f} = the last sample under load, "
      f"{after['t'] / 60:.1f} = after {idle:g} min idle)")
print(f"{'':<38} {'accelerator':>24} {'client proxy':>24}   target")
cells, oks = [], []
for proc in procs:
    w, e = warm["procs"][proc]["rss_kib"], end["procs"][proc]["rss_kib"]
    drift = 100 * (e - w) / w if w else float("inf")
    cells.append(f"{mib(w):.1f} -> {mib(e):.1f} ({drift:+.1f} %)")
    oks.append(drift <= 5)
print(f"{'RSS MiB, minute ' + f'{warmup:g}' + ' -> last loaded':<38} {cells[0]:>24} {cells[1]:>24}   "
      f"drift <= 5 %: {met(oks[0])} / {met(oks[1])}")
# What the drift is made of: anonymous memory (heap, stacks), or file
# pages (the binary's code, paged in as rarer paths first run). No target:
# the row's measure is the RSS above.
for kind, what in (("anon_kib", "anonymous"), ("file_kib", "file-backed")):
    if any(kind not in s["procs"][proc] for s in (warm, end) for proc in procs):
        continue
    cells = []
    for proc in procs:
        w, e = warm["procs"][proc].get(kind, 0), end["procs"][proc].get(kind, 0)
        cells.append(f"{mib(w):.1f} -> {mib(e):.1f} ({e - w:+d} KiB)")
    print(f"{'  of which ' + what:<38} {cells[0]:>24} {cells[1]:>24}   (no target)")
cells, oks = [], []
for proc in procs:
    b, a = base["procs"][proc]["fds"], after["procs"][proc]["fds"]
    cells.append(f"{b} -> {a} ({a - b:+d})")
    oks.append(abs(a - b) <= 10)
print(f"{'FDs, baseline -> after idle':<38} {cells[0]:>24} {cells[1]:>24}   +- 10: {met(oks[0])} / {met(oks[1])}")
cells = []
for proc in procs:
    cells.append(f"{base['procs'][proc]['threads']} -> {max(s['procs'][proc]['threads'] for s in samples)}"
                 f" -> {after['procs'][proc]['threads']}")
print(f"{'threads, baseline -> max -> after':<38} {cells[0]:>24} {cells[1]:>24}   (no target)")
print(f"{'panics (grep -c panicked)':<38} {panics['accelerator']:>24} {panics['client']:>24}   "
      f"0: {met(panics['accelerator'] == 0)} / {met(panics['client'] == 0)}")
print(f"{'unexpected 5xx (at the user agent)':<38} {'':>24} {total['five_xx']:>24}   0: {met(total['five_xx'] == 0)}")
budget = cache["budget"] or 0
cell = f"{cache['max_bytes'] / 1048576:.1f} / {budget / 1048576:.1f}"
print(f"{'cache_bytes max / cache_budget MiB':<38} {'':>24} {cell:>24}   "
      f"<= budget at every sample ({cache['polls']}, every 5 s): {met(cache['over'] == 0 and budget > 0)}"
      + (f"; {cache['failed_polls']} polls failed" if cache["failed_polls"] else ""))
if total["wrong"] or total["failed"] or odd:
    print(f"(not a target of the row, but: {total['wrong']} wrong bodies, {total['failed']} failed requests, "
          f"{odd} other non-200 answers)")
EOF
for name in accelerator client; do
    n=$(grep -c -e panicked -e ' ERROR ' "$lab_tmp/logs/$name.log" || true)
    if ((n > 0)); then
        echo "$name logged $n error/panic lines, e.g.:"
        grep -m 3 -e panicked -e ' ERROR ' "$lab_tmp/logs/$name.log"
    fi
done
lab_check_alive
