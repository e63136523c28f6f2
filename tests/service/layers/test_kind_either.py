"""``kind.either`` forwards each step to the kind it chooses, ``inline`` and
``cache_key`` included: /v1/encode's kind (ENCODE or MULTI_VECTOR by the parsed
request's type) keeps small array bodies prepared on the event loop, as ENCODE does, and
keeps no multi-vector answer in the response cache. Without the forwarding, ``inline``
would be ``kind._never`` (every body off the loop) and the first test fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np

from service.engine import (
    ENCODE,
    ENCODE_OR_MULTI_VECTOR,
    ArrayInput,
    EncodeRequest,
    MultiVectorRequest,
    WireCost,
)
from service.engine.kind import Serving
from tests.service.layers.conftest import layer_settings

JSON = WireCost(per_float=12.0)


def serving(tmp_path: Path) -> Serving:
    """Only the settings: what the inline checks read (the count of items)."""
    nothing = cast(Any, None)
    return Serving(nothing, layer_settings(tmp_path), nothing, nothing)


def arrays() -> EncodeRequest:
    item = ArrayInput(rows=2, decode=lambda: np.zeros((2, 8), np.float32))
    return EncodeRequest([item], JSON)


def test_either_asks_the_chosen_kind_whether_it_is_prepared_inline(tmp_path: Path) -> None:
    s = serving(tmp_path)
    assert ENCODE.inline(arrays(), s) is True
    assert ENCODE_OR_MULTI_VECTOR.inline(arrays(), s) is True  # the fast path kept
    assert ENCODE_OR_MULTI_VECTOR.inline(EncodeRequest(["a text"], JSON), s) is False
    assert ENCODE_OR_MULTI_VECTOR.inline(MultiVectorRequest(["a text"], JSON), s) is False


def test_either_keeps_no_answer_of_a_kind_without_a_cache_key(tmp_path: Path) -> None:
    from service.engine import MULTI_VECTOR

    key = ENCODE_OR_MULTI_VECTOR.cache_key
    assert key is not None
    assert key((MULTI_VECTOR, object()), cast(Any, None), serving(tmp_path)) is None
