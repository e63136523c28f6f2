"""What one soak saw, and its verdict: ``SoakReport.problems()`` empty means it passed."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.soak.config import CLASSES, FAILURES, SHED, Limits, SoakConfig


@dataclass
class Failure:
    kind: str
    cls: str
    variant: str
    rid: int
    detail: str

    def __str__(self) -> str:
        name = f"{self.cls}/{self.variant}" if self.variant else self.cls
        where = f"{name} request {self.rid}" if self.rid >= 0 else "server"
        return f"{self.kind}: {where}: {self.detail}"


@dataclass
class SoakReport:
    """What one soak saw. ``problems()`` empty means it passed."""

    config: SoakConfig
    model: str
    limits: Limits
    server_settings: dict[str, str]
    pid: int = 0
    elapsed: float = 0.0
    outcomes: dict[str, Counter[str]] = field(
        default_factory=lambda: {cls: Counter() for cls in CLASSES}
    )
    variants: defaultdict[str, Counter[str]] = field(  # by Planned.label
        default_factory=lambda: defaultdict(Counter)
    )
    latencies: list[float] = field(default_factory=list)  # seconds, valid 2xx answers
    checked: int = 0  # 2xx answers compared with onnxruntime
    largest_difference: float = 0.0  # among the answers within atol
    rss_ready: float | None = None
    rss_start: float | None = None  # at the end of the warm-up
    rss_end: float | None = None
    rss_peak: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(f.kind == kind for f in self.failures)

    def sent(self, cls: str) -> int:
        return self.outcomes[cls]["sent"]

    @property
    def rss_growth(self) -> float | None:
        if self.rss_start is None or self.rss_end is None:
            return None
        return self.rss_end - self.rss_start

    def percentile_ms(self, q: float) -> float:
        """Nearest-rank percentile of valid answers' latency, in ms (NaN with none)."""
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        return 1000 * ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    def problems(self) -> list[str]:
        """Every reason this run fails; empty when it passes."""
        out = [f"{self.count(kind)} {kind}" for kind in FAILURES if self.count(kind)]
        out += [f"no {cls} request sent" for cls in CLASSES if not self.sent(cls)]
        return out

    def summary(self) -> dict[str, Any]:
        """What the run measured, as JSON (``bench/out/soak.json``)."""
        return {
            "model": self.model,
            "config": asdict(self.config),
            "limits": asdict(self.limits),
            "server_settings": self.server_settings,
            "elapsed_s": self.elapsed,
            "outcomes": {cls: dict(seen) for cls, seen in self.outcomes.items()},
            "variants": {label: dict(seen) for label, seen in self.variants.items()},
            "valid_answers": len(self.latencies),
            "p50_ms": self.percentile_ms(0.5),
            "p99_ms": self.percentile_ms(0.99),
            "checked": self.checked,
            "largest_difference": self.largest_difference,
            "rss_mb": {
                "ready": self.rss_ready,
                "after_warmup": self.rss_start,
                "end": self.rss_end,
                "peak": self.rss_peak,
            },
            "failures": [str(f) for f in self.failures],
            "notes": self.notes,
            "problems": self.problems(),
        }

    def render(self) -> str:
        cfg, lim = self.config, self.limits
        lines = [
            f"soak: {self.elapsed:.0f} s, {cfg.clients} clients + {cfg.slow_clients} slow, "
            f"model {self.model} (d_model {lim.d_model}), server pid {self.pid}",
            "server settings: " + " ".join(f"{k}={v}" for k, v in self.server_settings.items()),
            f"slow clients: each request spread over {cfg.slow_seconds:g} s in chunks every "
            f"{cfg.slow_interval:g} s",
            "",
            f"| class | sent | 2xx | refused (4xx by status) | shed {'/'.join(map(str, SHED))} "
            "| closed, no answer | failures |",
            "|---|---|---|---|---|---|---|",
        ]
        for cls in CLASSES:
            seen = self.outcomes[cls]
            ok = sum(n for k, n in seen.items() if k.isdigit() and k.startswith("2"))
            refused = " ".join(
                f"{k}×{n}"
                for k, n in sorted(seen.items())
                if k.isdigit() and k.startswith("4") and int(k) not in SHED
            )
            shed = sum(seen[str(s)] for s in SHED)
            closed = " ".join(
                f"{k}×{n}" for k, n in sorted(seen.items()) if not k.isdigit() and k != "sent"
            )
            failed = sum(f.cls == cls for f in self.failures)
            lines.append(
                f"| {cls} | {seen['sent']} | {ok} | {refused or '-'} | {shed} "
                f"| {closed or '-'} | {failed} |"
            )
        lines += ["", "| request | sent | answers |", "|---|---|---|"]
        for label, seen in sorted(self.variants.items()):
            answers = " ".join(f"{k}×{n}" for k, n in sorted(seen.items()) if k != "sent")
            lines.append(f"| {label} | {seen['sent']} | {answers or '-'} |")
        lines += [
            "",
            f"valid answers: {len(self.latencies)}, latency p50 {self.percentile_ms(0.5):.1f} ms, "
            f"p99 {self.percentile_ms(0.99):.1f} ms; {self.checked} 2xx answers checked against "
            f"onnxruntime in-process (same graph, each sequence alone): atol {cfg.atol:g}, "
            f"largest difference of a right answer {self.largest_difference:.2g}",
        ]
        growth = self.rss_growth
        verdict = (
            "unknown" if growth is None else ("PASS" if growth <= cfg.max_rss_growth_mb else "FAIL")
        )
        lines.append(
            f"server RSS: {mb(self.rss_ready)} MB at ready, {mb(self.rss_start)} MB after the "
            f"{cfg.warmup_seconds:g} s warm-up, {mb(self.rss_end)} MB at the end, peak "
            f"{self.rss_peak:.1f} MB: growth {mb(growth)} MB, allowed {cfg.max_rss_growth_mb:g} "
            f"MB: {verdict}"
        )
        lines.append(", ".join(f"{kind} {self.count(kind)}" for kind in FAILURES))
        shown = self.failures[:20]
        if shown:
            lines += ["", f"first {len(shown)} of {len(self.failures)} failures:"]
            lines += [f"  {f}" for f in shown]
        lines += [f"note: {n}" for n in self.notes]
        problems = self.problems()
        lines += [
            "",
            "RESULT: " + ("PASS" if not problems else "FAIL (" + "; ".join(problems) + ")"),
        ]
        return "\n".join(lines)


def mb(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"
