#!/usr/bin/env bash
# The container engine for `make container-check`: Debian's podman with runc, and
# debootstrap for base images made of Debian packages when no registry answers.
set -euo pipefail
NEEDED=""
command -v podman >/dev/null || NEEDED="$NEEDED podman"
command -v runc >/dev/null || NEEDED="$NEEDED runc"
command -v debootstrap >/dev/null || test -x /usr/sbin/debootstrap || NEEDED="$NEEDED debootstrap"
if [ -n "$NEEDED" ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086  # one word per package
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $NEEDED >/dev/null
fi
podman --version
