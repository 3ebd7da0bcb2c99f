# The AsyncAPI project's tools for the tests of the documents ruststream writes (sourced
# by scripts/test), each installed once, only when missing:
# - @asyncapi/parser 3 and @asyncapi/react-component 3 from the npm registry, into
#   .tools/asyncapi; exports RUSTSTREAM_ASYNCAPI_NODE_PATH, the node_modules folder
#   scripts/asyncapi/validate.cjs loads the parser from and the page test takes the
#   component's standalone bundle from;
# - Chromium (Debian's package), which the page test loads /asyncapi in, headless;
#   exports RUSTSTREAM_CHROMIUM.
source scripts/brokers/lib.sh
asyncapi_dir=$PWD/.tools/asyncapi
install_from_debian nodejs node || return 1
install_from_debian npm npm || return 1
install_from_debian chromium chromium || return 1
for package in parser react-component; do
  if [ ! -f "$asyncapi_dir/node_modules/@asyncapi/$package/package.json" ]; then
    mkdir -p "$asyncapi_dir"
    echo "installing @asyncapi/$package@3 into $asyncapi_dir" >&2
    (cd "$asyncapi_dir" && npm install --no-audit --no-fund --silent "@asyncapi/$package@3" >&2) || return 1
  fi
done
export RUSTSTREAM_ASYNCAPI_NODE_PATH="$asyncapi_dir/node_modules"
RUSTSTREAM_CHROMIUM=$(command -v chromium)
export RUSTSTREAM_CHROMIUM
