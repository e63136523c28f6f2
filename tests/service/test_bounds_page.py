"""docs/security.md lists every bound a caller or a model directory meets: its tables are
``python -m service.bounds``'s, and every setting is either a bound there or declared as
not one (``NOT_BOUNDS``), so a new setting cannot go unlisted."""

from __future__ import annotations

from pathlib import Path

from service import bounds
from service.settings import Settings
from tests.service.test_reference_tables import table_at

SECURITY_MD = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def test_the_page_holds_the_generated_tables() -> None:
    page = SECURITY_MD.read_text(encoding="utf-8")
    caller, model_directory = bounds.tables()
    header = caller.splitlines()[0]
    first = table_at(page, header)
    rest = page[page.index(first) + len(first) :]
    assert (first, table_at(rest, header)) == (caller, model_directory), (
        "regenerate them: python -m service.bounds --write"
    )


def test_every_setting_is_a_bound_or_declared_not_one() -> None:
    listed = [b.setting for b in (*bounds.CALLER, *bounds.MODEL_DIRECTORY) if b.setting]
    assert len(listed) == len(set(listed)), "a setting listed twice"
    assert not set(listed) & bounds.NOT_BOUNDS, "a setting both a bound and not one"
    assert set(listed) | bounds.NOT_BOUNDS == set(Settings.model_fields), (
        "list the new setting in service/bounds.py (CALLER, MODEL_DIRECTORY or NOT_BOUNDS)"
    )


def test_a_setting_left_out_would_fail() -> None:
    """The completeness check above can fail: without one listed bound it is incomplete."""
    listed = {b.setting for b in bounds.CALLER[1:] if b.setting}
    listed |= {b.setting for b in bounds.MODEL_DIRECTORY if b.setting}
    assert listed | bounds.NOT_BOUNDS != set(Settings.model_fields)


def test_every_constant_bound_names_a_real_constant() -> None:
    for bound in (*bounds.CALLER, *bounds.MODEL_DIRECTORY):
        assert (bound.setting is None) != (bound.constant is None), bound
        if bound.constant is not None:
            module, name = bound.constant
            assert isinstance(getattr(module, name), int | float | dict), bound
