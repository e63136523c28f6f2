"""Reading metrics: one meaning for every test.

``metric(source, name, **labels)`` is the sum of the samples called ``name`` (the
exposition's own name: ``attnserve_requests_total``, ``..._count``, ``..._bucket``)
whose labels include ``labels``; 0 when there is none (a labelled child never
touched is not exported). The source is a server's base URL (its ``/metrics``)
or an in-process registry (the layer tests run the engine without a server).
``scrape`` reads once, for several values or a value per label.
"""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


class Scrape:
    """Every sample of one reading."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def _matching(self, name: str, labels: dict[str, str]) -> list[Sample]:
        return [
            s
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples ``name`` that carry ``labels`` (0 if none)."""
        return sum(float(s.value) for s in self._matching(name, labels))

    def by(self, label: str, name: str, **labels: str) -> dict[str, float]:
        """``value(name, **labels)`` for each value of ``label`` seen."""
        sums: dict[str, float] = {}
        for s in self._matching(name, labels):
            key = s.labels.get(label, "")
            sums[key] = sums.get(key, 0.0) + float(s.value)
        return sums


def scrape(source: str | CollectorRegistry) -> Scrape:
    """Every sample of ``{source}/metrics`` (asserting 200), or of a registry."""
    if isinstance(source, CollectorRegistry):
        families = list(source.collect())
    else:
        answer = httpx.get(f"{source}/metrics", timeout=10)
        assert answer.status_code == 200, answer.text[:300]
        families = list(text_string_to_metric_families(answer.text))
    return Scrape([sample for family in families for sample in family.samples])


def metric(source: str | CollectorRegistry, name: str, **labels: str) -> float:
    """One value (see the module docstring)."""
    return scrape(source).value(name, **labels)
