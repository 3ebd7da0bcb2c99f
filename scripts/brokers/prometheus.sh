# Prometheus from Debian's package, for the metrics tests (sourced by scripts/test). Each
# test starts a server of its own on a free port with a config naming the service it
# scrapes, so nothing is started here: the binary is installed and its path exported.
# Point at another binary with RUSTSTREAM_PROMETHEUS_BIN.
if [ -z "${RUSTSTREAM_PROMETHEUS_BIN:-}" ]; then
  if ! command -v prometheus >/dev/null; then
    sudo_if_needed=""
    [ "$(id -u)" -ne 0 ] && sudo_if_needed="sudo"
    ($sudo_if_needed apt-get update -qq && $sudo_if_needed apt-get install -y -qq --no-install-recommends prometheus) >&2 \
      || { echo "cannot install prometheus" >&2; return 1; }
  fi
  RUSTSTREAM_PROMETHEUS_BIN=$(command -v prometheus)
  export RUSTSTREAM_PROMETHEUS_BIN
fi
