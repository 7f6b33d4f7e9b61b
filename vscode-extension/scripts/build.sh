#!/usr/bin/env bash
# Type-checks, bundles (esbuild) and packages (vsce) the extension into build/matlint.vsix,
# and compiles the editor tests into out/. Offline once ci-setup.sh has run.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
[[ -x "$MATLINT_NODE24_BIN/node" ]] && export PATH="$MATLINT_NODE24_BIN:$PATH"
cd "$MATLINT_EXT_DIR"
[[ -d node_modules ]] || npm ci
npx --no-install tsc -p . --noEmit
npx --no-install tsc -p tsconfig.test.json
mkdir -p "$(dirname "$MATLINT_VSIX")"
npx --no-install vsce package --no-dependencies --out "$MATLINT_VSIX"
