#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the database tests, from Debian's `postgresql` package
# (installed when missing), and print its URL: initdb + pg_ctl as the postgres user in a fresh
# folder, on loopback only, trust authentication (nothing but this machine reaches it).
#   URL=$(bash scripts/postgres.sh start)   ...   bash scripts/postgres.sh stop
# The folder is /tmp/hymt-postgres; a server already running there is stopped first.
set -euo pipefail
DIR=/tmp/hymt-postgres
PORT=${HYMT_TEST_POSTGRES_PORT:-55432}
as_postgres() { runuser -u postgres -- "$@"; }
bin_dir() { find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -1; }

stop() {
  local bin
  bin=$(bin_dir)
  if [ -n "$bin" ] && [ -f "$DIR/data/postmaster.pid" ]; then
    as_postgres "$bin/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$DIR"
}

start() {
  if [ -z "$(bin_dir)" ]; then
    apt-get install -y -q postgresql >/dev/null 2>&1 || {
      apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null
    }
  fi
  local bin
  bin=$(bin_dir)
  stop
  mkdir -p "$DIR"
  chown postgres: "$DIR"
  as_postgres "$bin/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 >/dev/null
  as_postgres "$bin/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w \
    -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1" start >/dev/null
  as_postgres "$bin/createdb" -h 127.0.0.1 -p "$PORT" -U postgres hymt_test
  echo "postgresql+psycopg://postgres@127.0.0.1:$PORT/hymt_test"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
