"""``attnserve-healthcheck [live|ready]``: the container's health probe, as a command.

Docker and Compose run health checks inside the container, where the image has
Python but no curl. One command with no spaces in its arguments also survives
engines that re-split an exec-form check on whitespace (podman 4.3's Docker API
does). It probes this server's own port on loopback and exits 0 on 200, else 1.
Containers check liveness: a busy replica is slow, not broken, and must not be
restarted; readiness is for load balancers and Kubernetes.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

from service.settings import Settings

PATHS = {"live": "/health/live", "ready": "/health/ready"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnserve-healthcheck", description=__doc__)
    parser.add_argument("probe", nargs="?", choices=sorted(PATHS), default="live")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds (default 2)")
    args = parser.parse_args(argv)
    url = f"http://127.0.0.1:{Settings().port}{PATHS[args.probe]}"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:  # refused, reset, timed out
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"{url}: HTTP {status}", file=sys.stderr)
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
