# Redis (Debian's redis-server 7.0) on 127.0.0.1 for the Redis Streams tests (sourced by
# scripts/test). Installed with apt-get when missing, run as a plain process on a port and
# a data directory of its own under .brokers/redis, with the append-only file written and
# fsynced on every write (`--appendonly yes --appendfsync always`): what an XADD's reply
# confirms is on disk. Point the tests at another server with RUSTSTREAM_REDIS_URL;
# nothing is started then.
source scripts/brokers/lib.sh
if [ -z "${RUSTSTREAM_REDIS_URL:-}" ]; then
  install_from_debian redis-server redis-server || return 1
  redis_port=${RUSTSTREAM_REDIS_PORT:-16379}
  if ! listening "$redis_port"; then
    base=$PWD/.brokers/redis
    # A fresh server each start: the tests' streams are not kept across runs.
    rm -rf "$base"
    mkdir -p "$base"
    nohup redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$base" \
      --appendonly yes --appendfsync always --save "" --protected-mode no \
      > .brokers/redis-server.log 2>&1 &
    # Ready when it answers PING.
    for _ in $(seq 1 100); do
      [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] && break
      sleep 0.1
    done
    if [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" != PONG ]; then
      echo "redis-server did not answer on 127.0.0.1:$redis_port; its log:" >&2
      tail -50 .brokers/redis-server.log >&2 || true
      return 1
    fi
    echo "started redis-server on 127.0.0.1:$redis_port" >&2
  fi
  export RUSTSTREAM_REDIS_URL="redis://127.0.0.1:$redis_port"
fi
