#!/usr/bin/env bash
# The npm package `oidc-provider` (a certified OpenID Provider) the sign-in tests run on the
# machine's Node.js (tests/harness/oidc.py), installed into <venv>/oidc-provider. `make test`
# runs it; without node/npm it says which tests will skip and succeeds.
#
#   tests/setup/oidc-provider.sh [VENV]     (default .venv)
set -uo pipefail
VENV="${1:-.venv}"
DIR="$VENV/oidc-provider"
if [ -f "$DIR/node_modules/oidc-provider/package.json" ]; then
    exit 0
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "oidc-provider: no node/npm here: the sign-in tests (tests/identity, tests/security/test_oidc_*.py) will skip" >&2
    exit 0
fi
mkdir -p "$DIR"
if ! (cd "$DIR" && npm install --no-audit --no-fund --silent oidc-provider@9); then
    echo "oidc-provider: npm install failed: the sign-in tests will skip" >&2
fi
exit 0
