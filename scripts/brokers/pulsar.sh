# pulsar-lite (Pulsar binary protocol) on 127.0.0.1 for the Pulsar tests (sourced by
# scripts/test). The tests reach it through their own frame relay (see
# crates/ruststream-test-support/src/pulsar_relay.rs). The binary and its config are always
# installed: the restart fault test runs a broker of its own. Point the other tests at
# another broker with RUSTSTREAM_PULSAR_ADDR (host:port); nothing is started then.
source scripts/brokers/lib.sh
install_from_wheel pulsar-lite==0.2.0 \
  c51c34a59f11b1964cf07f1c1660acaf26bd29da4504689d6b3fe3080167a779 \
  pulsar_lite-0.2.0.data/purelib/pulsar_lite/bin/pulsar-lite pulsar-lite
# Without a config file that disables metrics it also listens on 0.0.0.0:8080.
printf '[metrics]\nenabled = false\n' > .brokers/pulsar-lite.toml
if [ -z "${RUSTSTREAM_PULSAR_ADDR:-}" ]; then
  pulsar_port=${RUSTSTREAM_PULSAR_PORT:-16650}
  if ! listening "$pulsar_port"; then
    mkdir -p .brokers/pulsar-data
    nohup .brokers/bin/pulsar-lite --config .brokers/pulsar-lite.toml \
      --addr "127.0.0.1:$pulsar_port" --db-path .brokers/pulsar-data \
      > .brokers/pulsar-lite.log 2>&1 &
    wait_listening "$pulsar_port" pulsar-lite
    echo "started pulsar-lite on 127.0.0.1:$pulsar_port" >&2
  fi
  export RUSTSTREAM_PULSAR_ADDR="127.0.0.1:$pulsar_port"
fi
