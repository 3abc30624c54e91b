#!/usr/bin/env bash
# The HTTP caching conformance suite "cache-tests" (https://cache-tests.fyi,
# npm http-cache-tests@0.4.5: 350 tests a command line can run) against
# rproxy, on loopback only, as issue 21 measures it: the client proxy alone
# as a gateway, and the pair (client proxy -> accelerator -> the suite's
# origin). The suite stays outside the repository: it is installed from npm
# into a work directory on first use.
#
# Usage: scripts/conformance.sh [RPROXY_BINARY] [CONFIG...]
#   RPROXY_BINARY  default: target/release/rproxy (built when missing)
#   CONFIG         any of: baseline client pair   (default: client pair)
#     baseline  runner -> the suite's server (no cache: what passes anyway)
#     client    runner -> rproxy client (gateway) -> the suite's server
#     pair      runner -> rproxy client (gateway) -> rproxy accelerator -> server
# Environment:
#   CACHE_TESTS_DIR=dir  where the suite is installed, results and logs go
#                        (default ${TMPDIR:-/tmp}/rproxy-cache-tests)
#   TAG=name             results-<config>-<name>.json (default results-<config>.json)
#   SERVER_PORT=28000 ACCEL_PORT=28081 CLIENT_PORT=28082 (all on 127.0.0.1)
#   KEEP_CACHE=1         keep the temporary cache and spool directories
#   EXTRA_CLIENT_ARGS / EXTRA_ACCEL_ARGS   more flags for the roles
# Needs: node and npm (Debian nodejs, npm). About a minute.
#
# Counts are printed as the suite's own display classifies them
# (lib/display.mjs: dependencies honoured): pass, fail (a required test),
# optional_fail, check_yes/no, setup_fail, dependency_fail; "passed" is pass
# + check_yes. The non-passing tests go to failures-<config>.tsv.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=${CACHE_TESTS_DIR:-${TMPDIR:-/tmp}/rproxy-cache-tests}
mkdir -p "$HERE"
BIN=${1:-$root/target/release/rproxy}
shift || true
if [ ! -x "$BIN" ] && [ "$BIN" = "$root/target/release/rproxy" ]; then
  (cd "$root" && cargo build --release --quiet) || exit 2
fi
CONFIGS=("$@")
[ ${#CONFIGS[@]} -eq 0 ] && CONFIGS=(client pair)
OUT=$HERE
TAG=${TAG:-}
SERVER_PORT=${SERVER_PORT:-28000}
ACCEL_PORT=${ACCEL_PORT:-28081}
CLIENT_PORT=${CLIENT_PORT:-28082}
# Imported relative to themselves: next to the installed suite.
cp "$root/scripts/conformance/summarize.mjs" "$root/scripts/conformance/listen-loopback.cjs" "$HERE/"
PKG=$HERE/node_modules/http-cache-tests

[ -x "$BIN" ] || { echo "not executable: $BIN" >&2; exit 2; }
BIN=$(readlink -f "$BIN")
mkdir -p "$OUT"
if [ ! -f "$PKG/cli.mjs" ]; then
  (cd "$HERE" && npm install --no-audit --no-fund http-cache-tests@0.4.5) || exit 2
fi
[ "$(node -p "require('$PKG/package.json').version")" = 0.4.5 ] || echo "warning: http-cache-tests is not 0.4.5" >&2

PIDS=()
TMPDIRS=()
stop_all() {
  local p
  for p in "${PIDS[@]}"; do
    kill -TERM "$p" 2>/dev/null
  done
  for p in "${PIDS[@]}"; do
    # rproxy drains for up to --drain-timeout (30 s); the suite is done by now, so it is quick
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  PIDS=()
  if [ "${KEEP_CACHE:-0}" != 1 ]; then
    local d
    for d in "${TMPDIRS[@]}"; do rm -rf -- "$d"; done
  fi
  TMPDIRS=()
}
trap 'stop_all' EXIT
trap 'exit 130' INT TERM

port_free() { ! (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; }
wait_port() { # port, pid
  for _ in $(seq 1 100); do
    (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

run_config() {
  local cfg=$1 suffix="" base logs
  [ -n "$TAG" ] && suffix="-$TAG"
  logs=$OUT/logs-$cfg$suffix
  rm -rf -- "$logs"; mkdir -p "$logs"
  for p in $SERVER_PORT $ACCEL_PORT $CLIENT_PORT; do
    port_free "$p" || { echo "port 127.0.0.1:$p is in use; set SERVER_PORT/ACCEL_PORT/CLIENT_PORT" >&2; return 1; }
  done

  # the suite's origin (its test server), bound to 127.0.0.1 by a preload
  (cd "$PKG" && npm_config_protocol=http npm_config_port=$SERVER_PORT \
     npm_config_pidfile="$logs/server.pid" \
     exec node --require "$HERE/listen-loopback.cjs" server/server.mjs) > "$logs/server.log" 2>&1 &
  PIDS+=($!)
  wait_port "$SERVER_PORT" $! || { echo "test server did not start" >&2; return 1; }
  base=http://127.0.0.1:$SERVER_PORT

  if [ "$cfg" = pair ]; then
    local spool; spool=$(mktemp -d "$OUT/spool-$cfg.XXXXXX"); TMPDIRS+=("$spool")
    # shellcheck disable=SC2086
    "$BIN" accelerator --listen 127.0.0.1:$ACCEL_PORT --admin-listen off \
      --origin http://127.0.0.1:$SERVER_PORT --spool-dir "$spool" ${EXTRA_ACCEL_ARGS:-} \
      > "$logs/accelerator.log" 2>&1 &
    PIDS+=($!)
    wait_port "$ACCEL_PORT" $! || { echo "accelerator did not start" >&2; return 1; }
    base=http://127.0.0.1:$ACCEL_PORT
  fi
  if [ "$cfg" = client ] || [ "$cfg" = pair ]; then
    local cache; cache=$(mktemp -d "$OUT/cache-$cfg.XXXXXX"); TMPDIRS+=("$cache")
    # gateway mode: the suite sends origin-form requests; shared cache is the default (no --private)
    # shellcheck disable=SC2086
    "$BIN" client --listen 127.0.0.1:$CLIENT_PORT --admin-listen off \
      --upstream "$base" --cache "$cache" ${EXTRA_CLIENT_ARGS:-} \
      > "$logs/client.log" 2>&1 &
    PIDS+=($!)
    wait_port "$CLIENT_PORT" $! || { echo "client proxy did not start" >&2; return 1; }
    base=http://127.0.0.1:$CLIENT_PORT
  fi

  local res=$OUT/results-$cfg$suffix.json
  echo "== $cfg: runner -> $base (logs in $logs)"
  # same as `npm run --silent cli --base=$base` inside the package (no trailing slash on base!)
  (cd "$PKG" && npm_config_base=$base npm_config_id= npm_package_config_id= \
     node --no-warnings cli.mjs) > "$res.tmp" 2> "$logs/cli.err"
  if node -e "JSON.parse(require('fs').readFileSync('$res.tmp','utf8'))" 2>/dev/null; then
    mv "$res.tmp" "$res"
    node "$HERE/summarize.mjs" "$res"
    node "$HERE/summarize.mjs" "$res" --list --tsv | grep -P '^[^\t]+\t[^\t]+\t' > "$OUT/failures-$cfg$suffix.tsv"
    echo "   raw results: $res ; non-passing tests (suite, kind, result, raw result, id, name, error, message, depends_on): $OUT/failures-$cfg$suffix.tsv"
  else
    echo "runner output is not JSON: see $res.tmp and $logs/cli.err" >&2
  fi
  stop_all
}

rc=0
for cfg in "${CONFIGS[@]}"; do
  case $cfg in
    baseline|client|pair) run_config "$cfg" || rc=1 ;;
    *) echo "unknown config: $cfg" >&2; rc=2 ;;
  esac
done
exit $rc
