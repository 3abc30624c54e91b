#!/usr/bin/env bash
# The project's test command (the one the README and CI use): every test,
# example and bench target, built in the default (debug) profile.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo test --all-targets
