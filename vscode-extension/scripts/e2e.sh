#!/usr/bin/env bash
# Runs the editor tests: the extension in code-server driven by headless Chromium (after
# ci-setup.sh). Screenshots and logs land in build/vscode-e2e/. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
PYTHON="${PYTHON:-$MATLINT_REPO/.venv/bin/python}"
cd "$MATLINT_REPO"
exec "$PYTHON" -m pytest tests/test_vscode_e2e.py "$@"
