# The AsyncAPI project's parser (@asyncapi/parser 3, from the npm registry) for the tests
# that validate the documents ruststream writes (sourced by scripts/test). Installed once
# into .tools/asyncapi (only when missing); exports RUSTSTREAM_ASYNCAPI_NODE_PATH, the
# node_modules folder scripts/asyncapi/validate.cjs loads it from.
source scripts/brokers/lib.sh
asyncapi_dir=$PWD/.tools/asyncapi
install_from_debian nodejs node || return 1
install_from_debian npm npm || return 1
if [ ! -f "$asyncapi_dir/node_modules/@asyncapi/parser/package.json" ]; then
  mkdir -p "$asyncapi_dir"
  echo "installing @asyncapi/parser@3 into $asyncapi_dir" >&2
  (cd "$asyncapi_dir" && npm install --no-audit --no-fund --silent @asyncapi/parser@3 >&2) || return 1
fi
export RUSTSTREAM_ASYNCAPI_NODE_PATH="$asyncapi_dir/node_modules"
