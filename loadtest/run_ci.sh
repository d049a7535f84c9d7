#!/usr/bin/env bash
# Short headless Locust run against an already-running server (started by `hymt start`).
# The exit code is Locust's, set by loadtest/locustfile.py: 0 pass, 1 failed requests, no
# requests, p95 over HYMT_P95_MS, or a start-up error (missing key file, bad data file).
# Reports go to loadtest/reports/ (git-ignored; CI keeps it as an artifact).
# Extra arguments are passed to locust, e.g. `loadtest/run_ci.sh --loglevel DEBUG`.
set -euo pipefail

cd "$(dirname "$0")/.."
mkdir -p loadtest/reports

exec locust -f loadtest/locustfile.py --headless \
    -u "${USERS:-4}" -r "${SPAWN_RATE:-2}" -t "${DURATION:-45s}" \
    --host "http://127.0.0.1:${PORT:-8080}" \
    --csv loadtest/reports/ci --html loadtest/reports/ci.html --only-summary \
    "$@"
