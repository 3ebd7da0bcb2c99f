# PostgreSQL (Debian's postgresql 15) on 127.0.0.1 for the inbox and outbox tests
# (sourced by scripts/test). Installed with apt-get when missing; a cluster of its own
# under /tmp/ruststream-postgres-<port>, run as the postgres user (the server refuses to
# run as root, and that user cannot reach into a checkout under a mode-700 folder), with
# trust authentication on 127.0.0.1 only. Point the tests at another server with
# RUSTSTREAM_POSTGRES_URL; nothing is started then.
source scripts/brokers/lib.sh
if [ -z "${RUSTSTREAM_POSTGRES_URL:-}" ]; then
  if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
    echo "installing postgresql (Debian)" >&2
    sudo_if_needed=""
    [ "$(id -u)" -ne 0 ] && sudo_if_needed="sudo"
    ($sudo_if_needed apt-get update -qq \
      && $sudo_if_needed apt-get install -y -qq --no-install-recommends postgresql) >&2 \
      || { echo "cannot install postgresql" >&2; return 1; }
  fi
  postgres_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  postgres_port=${RUSTSTREAM_POSTGRES_PORT:-15432}
  if ! listening "$postgres_port"; then
    base=/tmp/ruststream-postgres-$postgres_port
    # A fresh cluster each start: the tests' tables are not kept across runs.
    rm -rf "$base"
    mkdir -p "$base" .brokers
    as_postgres() { "$@"; }
    if [ "$(id -u)" -eq 0 ]; then
      chown postgres:postgres "$base"
      as_postgres() { su postgres -s /bin/bash -c "$(printf '%q ' "$@")"; }
    fi
    as_postgres "$postgres_bin/initdb" -D "$base/data" -A trust -U postgres > "$base/initdb.log" 2>&1 \
      || { echo "initdb failed; its log:" >&2; tail -30 "$base/initdb.log" >&2; return 1; }
    as_postgres "$postgres_bin/pg_ctl" -D "$base/data" -l "$base/server.log" \
      -o "-p $postgres_port -k $base -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on" \
      start > /dev/null 2>&1
    for _ in $(seq 1 100); do
      listening "$postgres_port" && break
      sleep 0.1
    done
    if ! listening "$postgres_port"; then
      echo "postgres did not listen on 127.0.0.1:$postgres_port; its log:" >&2
      tail -50 "$base/server.log" >&2 || true
      return 1
    fi
    echo "started postgres on 127.0.0.1:$postgres_port" >&2
  fi
  export RUSTSTREAM_POSTGRES_URL="postgres://postgres@127.0.0.1:$postgres_port/postgres"
fi
