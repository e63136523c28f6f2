"""docs/deployment.md's settings and metrics tables are the code's: each is generated
(``python -m service.reference_tables``) and the page must hold
exactly it, no row more or less; the label values a reader needs are checked against
the values the code uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service import reference_tables
from service.metrics import GRAPH_LABELS, Metrics
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT_MD = ROOT / "docs" / "deployment.md"


def table_at(text: str, header: str) -> str:
    """The Markdown table of ``text`` that starts with the line ``header``: every row up
    to the first line that is not one."""
    lines = text.splitlines()
    start = lines.index(header)  # ValueError: no such table
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[start:end])


def generated_tables() -> list[str]:
    return [reference_tables.settings_table(), reference_tables.metrics_table()]


@pytest.mark.parametrize("table", generated_tables(), ids=["settings", "metrics"])
def test_the_page_holds_the_generated_table(table: str) -> None:
    assert table_at(DEPLOYMENT_MD.read_text(), table.splitlines()[0]) == table, (
        "regenerate it: python -m service.reference_tables --write"
    )


def test_a_row_more_or_less_fails() -> None:
    """The check above can fail: a page missing a row or holding one more is told apart."""
    page = DEPLOYMENT_MD.read_text()
    for table in generated_tables():
        header, rule, first, *rest = table.splitlines()
        extra_row = "| `ATTNSERVE_NOT_A_SETTING` | `1` | nothing |"
        for wrong in (
            "\n".join([header, rule, *rest]),
            "\n".join([header, rule, first, *rest, extra_row]),
        ):
            assert table_at(page.replace(table, wrong), header) != table


def test_every_setting_has_a_row_with_its_default() -> None:
    rows = reference_tables.settings_table().splitlines()[2:]
    assert len(rows) == len(Settings.model_fields)
    for row, (name, field) in zip(rows, Settings.model_fields.items(), strict=True):
        assert row.startswith(f"| `ATTNSERVE_{name.upper()}` | "), row
        assert field.description and field.description in row, name
    by_name = {row.split(" | ")[0][3:-1]: row for row in rows}
    assert by_name["ATTNSERVE_MAX_BODY_BYTES"].startswith(
        "| `ATTNSERVE_MAX_BODY_BYTES` | `33554432` (32 MiB) | "
    )
    assert " | unset | " in by_name["ATTNSERVE_API_KEY"]
    assert " | `false` | " in by_name["ATTNSERVE_FOLLOW_SYMLINKS"]
    assert " | `15` | " in by_name["ATTNSERVE_POLL_SECONDS"]
    assert by_name["ATTNSERVE_MAX_HEADERS"].endswith(" At least `8`. |")


def test_every_metric_registered_is_documented() -> None:
    """A metric made without the helpers that note it would be missing from the table."""
    m = Metrics()
    registered = {(family.name, family.type) for family in m.registry.collect()}
    documented = {(d.name.removesuffix("_total"), d.kind) for d in m.documented}
    assert registered == documented


def values_used(pattern: str) -> set[str]:
    """Label values the service's code passes literally, found by ``pattern``."""
    found: set[str] = set()
    for source in (ROOT / "service").rglob("*.py"):
        found |= set(re.findall(pattern, source.read_text()))
    return found


def help_of(name: str) -> str:
    (doc,) = [d for d in Metrics().documented if d.name == name]
    return doc.help


def test_the_label_values_in_use_are_documented() -> None:
    graphs = help_of("attnserve_inference_seconds")
    assert set(GRAPH_LABELS.values()) >= {"sparse", "text"}
    for graph in GRAPH_LABELS.values():
        assert f"{graph} (" in graphs, graph
    reasons = values_used(r"refusals\.labels\(\"(\w+)\"\)") | values_used(r"\.refuse\(\s*\"(\w+)\"")
    assert {"queue_full", "memory", "deadline", "late", "send_timeout"} <= reasons
    for reason in reasons:
        assert re.search(rf"\b{reason}\b", help_of("attnserve_refusals_total")), reason
    outcomes = values_used(r"model_loads\.labels\(\w+, \"(\w+)\"\)")
    assert outcomes == {"loaded", "failed", "refused"}
    for outcome in outcomes:
        assert outcome in help_of("attnserve_model_loads_total"), outcome
