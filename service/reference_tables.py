"""The reference tables of docs/deployment.md, generated from the code.

``python -m service.reference_tables`` prints the settings table (every field of
``Settings``) and the metrics table (every metric ``Metrics`` registers), as the
error table of docs/api.md comes from ``service.errors``; a test keeps the page
equal to them; ``--write`` puts them on the page.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic.fields import FieldInfo

from service.metrics import Metrics
from service.settings import MiB, Settings


def _size(name: str, value: float) -> str:
    """A number as the docs write it: bytes settings also in MiB or GiB."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = f"`{value}`"
    if isinstance(value, int) and name.endswith("_bytes") and value >= MiB:
        unit, size = ("GiB", value / 1024**3) if value >= 1024**3 else ("MiB", value / MiB)
        text += f" ({size:g} {unit})"
    return text


def _default(name: str, value: object) -> str:
    """A setting's default as the docs write it."""
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float):
        return _size(name, value)
    return f"`{value}`"


def _meaning(name: str, field: FieldInfo) -> str:
    """The field's description, and its lower bound where one matters (above 1)."""
    floors = [m.ge for m in field.metadata if isinstance(getattr(m, "ge", None), int | float)]
    floor = f" At least {_size(name, floors[0])}." if floors and floors[0] > 1 else ""
    return f"{field.description}{floor}"


def settings_table() -> str:
    """The settings table of docs/deployment.md: every field's variable, default and
    description, in the order of the class."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        variable = f"`ATTNSERVE_{name.upper()}`"
        lines.append(f"| {variable} | {_default(name, field.default)} | {_meaning(name, field)} |")
    return "\n".join(lines)


def metrics_table() -> str:
    """The metrics table of docs/deployment.md."""
    lines = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    lines += [
        f"| `{m.name}` | {m.kind} | {', '.join(f'`{label}`' for label in m.labels)} | {m.help} |"
        for m in Metrics().documented
    ]
    return "\n".join(lines)


def rewrite(page: Path) -> None:
    """Replace each table on ``page`` (found by its header row) with its generated form."""
    lines = page.read_text(encoding="utf-8").split("\n")
    for table in (settings_table(), metrics_table()):
        rows = table.split("\n")
        start = lines.index(rows[0])
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[start:end] = rows
    page.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:  # run from the checkout's root
        rewrite(Path("docs/deployment.md"))
    else:
        print(settings_table(), metrics_table(), sep="\n\n")
