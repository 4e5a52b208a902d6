#!/usr/bin/env bash
# Start a throwaway PostgreSQL (Debian's package) for the tests; print the URL to use.
# Usage: export TX_TEST_POSTGRES_URL=$(bash scripts/ci/postgres.sh)
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) >&2
fi
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=${TX_PG_PORT:-$(free_port)}
dir=$(mktemp -d /tmp/tx-pg.XXXXXX)
chown postgres:postgres "$dir"
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }
as_pg "$bin/initdb -D $dir/data -A trust -U postgres" >&2
as_pg "$bin/pg_ctl -D $dir/data -l $dir/log -o '-p $port -k $dir -c listen_addresses=127.0.0.1' -w start" >&2
as_pg "$bin/createdb -h 127.0.0.1 -p $port -U postgres tx_test" >&2
echo "postgresql+psycopg://postgres@127.0.0.1:$port/tx_test"
