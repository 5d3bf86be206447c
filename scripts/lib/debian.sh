# Sourced by scripts/ensure-*: the root and apt-get helpers they share. The sourcing
# script sets `me` (its name, for messages) first.

# Runs a command as root: directly, or through sudo (non-interactive without a
# terminal, so CI never hangs on a password prompt).
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        if [ -t 0 ]; then sudo "$@"; else sudo -n "$@"; fi
    else
        echo "$me: not root and sudo is not available" >&2
        return 1
    fi
}

# Installs Debian packages; on failure runs `apt-get update` once and retries.
apt_install() {
    command -v apt-get >/dev/null 2>&1 || {
        echo "$me: apt-get not found (not a Debian-based system)" >&2
        return 1
    }
    echo "$me: installing Debian package(s) $*" >&2
    local install=(as_root env DEBIAN_FRONTEND=noninteractive
        apt-get install -y --no-install-recommends "$@")
    "${install[@]}" >&2 || {
        echo "$me: install failed; running apt-get update and retrying" >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update >&2 && "${install[@]}" >&2
    }
}
