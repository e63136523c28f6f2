"""``python -m bench.soak``: one server, the soak's clients against it, the verdict."""

from __future__ import annotations

import argparse
import asyncio
from contextlib import ExitStack
from pathlib import Path

from bench.lib.models import OUT, default_model_dir
from bench.lib.results import write_json
from bench.lib.server import running_server
from bench.soak.clients import Soak, rss_mb
from bench.soak.config import Limits, SoakConfig
from bench.soak.reference import Reference
from bench.soak.report import SoakReport
from bench.soak.requests import Requests
from model_export.manifest import Manifest


def run_soak(model_dir: Path, config: SoakConfig | None = None) -> SoakReport:
    """Start a server on ``model_dir``, soak it per ``config``, stop it; the report."""
    config = config or SoakConfig()
    manifest = Manifest.read(model_dir)
    limits = Limits.for_model(manifest)
    settings = {
        **limits.server_settings(),
        "MAX_QUEUED_REQUESTS": str(config.max_queued or max(1, config.clients // 2)),
        "BODY_TIMEOUT": f"{config.body_timeout:g}",
        "HEADER_TIMEOUT": f"{config.body_timeout:g}",
        "DRAIN_SECONDS": "0",  # no load balancer to wait for at the end
        **config.server_settings,
    }
    report = SoakReport(config, manifest.name, limits, settings)
    reference = Reference(model_dir, config.atol)
    with running_server(model_dir, **settings) as server:
        report.pid = server.pid
        report.rss_ready = rss_mb(report.pid)
        soak = Soak(server.port, reference, report, Requests(limits, config.seed))
        asyncio.run(soak.run())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Soak: many clients mixing good, bad, huge, slow and abandoned requests, "
        "for a bounded time (bench/soak/__init__.py says what each class expects)."
    )
    defaults = SoakConfig()
    parser.add_argument("--model-dir", type=Path, help="exported model directory (see above)")
    parser.add_argument("--seconds", type=float, default=defaults.seconds)
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--slow-clients", type=int, default=defaults.slow_clients)
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=defaults.warmup_seconds,
        help="RSS growth is measured from the end of this first part of the run",
    )
    parser.add_argument(
        "--max-rss-growth-mb",
        type=float,
        default=defaults.max_rss_growth_mb,
        help="allowed growth of the server's RSS from the warm-up's end to the run's end",
    )
    parser.add_argument("--atol", type=float, default=defaults.atol)
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=defaults.body_timeout,
        help="the server's ATTNSERVE_BODY_TIMEOUT and HEADER_TIMEOUT",
    )
    parser.add_argument(
        "--slow-seconds",
        type=float,
        default=defaults.slow_seconds,
        help="a slow client spreads one request over this long (beyond --body-timeout)",
    )
    parser.add_argument("--slow-interval", type=float, default=defaults.slow_interval)
    parser.add_argument(
        "--max-queued", type=int, help="ATTNSERVE_MAX_QUEUED_REQUESTS (default clients / 2)"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", type=Path, default=OUT / "soak.json")
    args = parser.parse_args(argv)
    config = SoakConfig(
        seconds=args.seconds,
        clients=args.clients,
        slow_clients=args.slow_clients,
        warmup_seconds=min(args.warmup_seconds, args.seconds / 2),
        max_rss_growth_mb=args.max_rss_growth_mb,
        atol=args.atol,
        body_timeout=args.body_timeout,
        slow_seconds=args.slow_seconds,
        slow_interval=args.slow_interval,
        max_queued=args.max_queued,
        seed=args.seed,
    )
    with ExitStack() as stack:
        model_dir = args.model_dir or stack.enter_context(default_model_dir())
        report = run_soak(model_dir, config)
    write_json(args.out, report.summary())
    print(report.render())
    return 0 if not report.problems() else 1
