# RabbitMQ (Debian's rabbitmq-server 3.10) on 127.0.0.1 for the RabbitMQ tests (sourced
# by scripts/test). Installed with apt-get when missing, run as a plain process with a
# node name, ports and directories of its own under /tmp/ruststream-rabbitmq-<port>
# (Debian's wrapper runs the server as the rabbitmq user, which cannot reach into a
# checkout under a mode-700 folder such as root's home or a `mktemp -d`). Point the tests
# at another broker with RUSTSTREAM_RABBITMQ_URL; nothing is started then.
source scripts/brokers/lib.sh
# Whether the broker on port $1 answers the AMQP 0-9-1 header with a method frame.
speaks_amqp() {
  python3 - "$1" <<'PY' 2>/dev/null
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2) as s:
    s.settimeout(2)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    sys.exit(0 if s.recv(1) == b"\x01" else 1)
PY
}
if [ -z "${RUSTSTREAM_RABBITMQ_URL:-}" ]; then
  install_from_debian rabbitmq-server rabbitmq-server || return 1
  rabbitmq_port=${RUSTSTREAM_RABBITMQ_PORT:-15673}
  if ! listening "$rabbitmq_port"; then
    base=/tmp/ruststream-rabbitmq-$rabbitmq_port
    # A fresh broker each start: the tests' durable queues (hundreds of quorum queues per
    # run) would otherwise all be recovered at boot and slow the broker down run by run.
    rm -rf "$base/mnesia"
    mkdir -p "$base/home" "$base/mnesia" "$base/log" .brokers
    chmod 755 "$base"
    echo '[].' > "$base/enabled_plugins"
    # Debian's wrapper switches to the rabbitmq user when run as root: it must own these.
    if [ "$(id -u)" -eq 0 ] && id rabbitmq >/dev/null 2>&1; then
      chown -R rabbitmq:rabbitmq "$base"
    fi
    HOME="$base/home" \
      RABBITMQ_NODENAME="ruststream-test@localhost" \
      RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
      RABBITMQ_NODE_PORT="$rabbitmq_port" \
      RABBITMQ_DIST_PORT=$((rabbitmq_port + 10000)) \
      RABBITMQ_MNESIA_BASE="$base/mnesia" \
      RABBITMQ_LOG_BASE="$base/log" \
      RABBITMQ_ENABLED_PLUGINS_FILE="$base/enabled_plugins" \
      ERL_EPMD_ADDRESS=127.0.0.1 \
      nohup rabbitmq-server > .brokers/rabbitmq-server.log 2>&1 &
    # About 8 s to its first accepted connection on these machines. Ready means it
    # answers the AMQP protocol header with connection.start (a method frame), not just
    # that its port is open.
    for _ in $(seq 1 600); do
      speaks_amqp "$rabbitmq_port" && break
      sleep 0.1
    done
    if ! speaks_amqp "$rabbitmq_port"; then
      echo "rabbitmq-server did not answer AMQP on 127.0.0.1:$rabbitmq_port; its log:" >&2
      tail -50 .brokers/rabbitmq-server.log >&2 || true
      return 1
    fi
    echo "started rabbitmq-server on 127.0.0.1:$rabbitmq_port" >&2
  fi
  export RUSTSTREAM_RABBITMQ_URL="amqp://guest:guest@127.0.0.1:$rabbitmq_port/%2f"
fi
