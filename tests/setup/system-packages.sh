#!/usr/bin/env bash
# The system packages the tests use, installed from Debian's packages when this runs as root
# with apt-get (CI, a fresh container); otherwise a message saying what is missing and which
# tests will skip. `make test` runs it before pytest, so `make test` alone tests for real.
# Idempotent and quiet: a package whose program is present is not looked at again.
#
#   tests/setup/system-packages.sh           install what is missing (root + apt-get)
#   tests/setup/system-packages.sh --check   only say what is missing
#   KLIQUE_SYSTEM_PACKAGES=skip make test    install nothing (a developer's own machine)
set -uo pipefail

# package | how to tell it is there | what skips without it
PACKAGES=(
    "slurm-wlm|cmd:slurmctld cmd:slurmd|the Slurm executor's tests (tests/slurm)"
    "munge|cmd:munged|the Slurm executor's tests (tests/slurm)"
    "podman|cmd:podman|the container executor's real tests (tests/workers/test_container.py)"
    "runc|cmd:runc|the container executor's real tests (tests/workers/test_container.py)"
    "busybox-static|file:/bin/busybox|the container executor's real tests (their image is a busybox root filesystem)"
    "postgresql|glob:/usr/lib/postgresql/*/bin/postgres|the PostgreSQL backend's tests (tests/daemon/test_pg_*.py, the restart test on postgresql)"
    "prometheus|cmd:promtool|the promtool check of /metrics (tests/daemon/test_metrics.py, test_lending_views.py)"
    "chromium|cmd:chromium|the dashboard's browser tests (tests/web/test_browser.py; the HTML is still checked without it)"
    "nodejs|cmd:node|the sign-in tests on a real OpenID Provider (tests/identity, tests/security/test_oidc_*.py)"
    "npm|cmd:npm|the sign-in tests on a real OpenID Provider (tests/identity, tests/security/test_oidc_*.py)"
)

present() {
    local probe
    for probe in $1; do
        case "$probe" in
            cmd:*) PATH="$PATH:/usr/sbin:/sbin" command -v "${probe#cmd:}" >/dev/null 2>&1 || return 1 ;;
            file:*) [ -e "${probe#file:}" ] || return 1 ;;
            glob:*) compgen -G "${probe#glob:}" >/dev/null || return 1 ;;
        esac
    done
}

missing=()
skips=()
for entry in "${PACKAGES[@]}"; do
    IFS='|' read -r pkg probes what <<<"$entry"
    if ! present "$probes"; then
        missing+=("$pkg")
        skips+=("$pkg: $what")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

explain() {
    echo "system packages: $1" >&2
    printf '  %s\n' "${skips[@]}" >&2
}

if [ "${1:-}" = "--check" ] || [ "${KLIQUE_SYSTEM_PACKAGES:-}" = "skip" ]; then
    explain "missing (not installed: ${1:-KLIQUE_SYSTEM_PACKAGES=skip}); without them these skip:"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    explain "missing, and this is not root with apt-get, so they are not installed (as root: apt-get install ${missing[*]}); without them these skip:"
    exit 0
fi
echo "installing from Debian's packages: ${missing[*]} ..." >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
        >/tmp/klique-system-packages.log 2>&1; then
    explain "could not install them (see /tmp/klique-system-packages.log); these will skip:"
fi
exit 0
