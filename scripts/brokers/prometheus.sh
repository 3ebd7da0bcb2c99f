# Prometheus from Debian's package, for the metrics tests (sourced by scripts/test). Each
# test starts a server of its own on a free port with a config naming the service it
# scrapes, so nothing is started here: the binary is installed and its path exported.
# Point at another binary with RUSTSTREAM_PROMETHEUS_BIN.
source scripts/brokers/lib.sh
if [ -z "${RUSTSTREAM_PROMETHEUS_BIN:-}" ]; then
  install_from_debian prometheus prometheus || return 1
  RUSTSTREAM_PROMETHEUS_BIN=$(command -v prometheus)
  export RUSTSTREAM_PROMETHEUS_BIN
fi
