"""The SDK's keywords: ``model=`` wherever a route takes a model, attention's common
options as keywords beside ``attention_options``, and results read as lists."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from attnserve_client import AsyncClient, Client, SparseResult, SparseVector, Usage
from tests.support.inputs import sequences

# Public methods where a model makes no sense: connection and readiness, the model
# listing, and ``model(name)``, whose argument is the model. encode_many forwards its
# keywords (``model`` among them) to encode.
NO_MODEL = {"close", "aclose", "models", "model", "ready", "wait_until_ready"}
FORWARDS = {"encode_many"}


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_every_method_that_reaches_a_model_takes_model(cls: type) -> None:
    methods = public_methods(cls)
    for name, signature in methods.items():
        if name in NO_MODEL:
            continue
        params = signature.parameters
        if name in FORWARDS:
            assert any(p.kind is p.VAR_KEYWORD for p in params.values()), name
            continue
        assert "model" in params, f"{cls.__name__}.{name} takes no model="
        assert params["model"].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params["model"].default is None, name
    # The two clients offer the same methods with the same keywords.
    twins = public_methods(Client if cls is AsyncClient else AsyncClient)
    assert set(methods) - {"close", "aclose"} == set(twins) - {"close", "aclose"}
    for name in set(methods) - {"close", "aclose"}:
        assert list(methods[name].parameters) == list(twins[name].parameters), name


def test_attention_keywords_ask_what_attention_options_ask(sdk_client: Client) -> None:
    """top_k, dtype and summaries as keywords give the answer the same entries of
    attention_options give (exactly: the same request)."""
    seqs = sequences((6, 4), seed=5)
    by_keywords = sdk_client.encode(
        seqs, return_attention=True, top_k=2, dtype="float16", summaries=["self", "first"]
    )
    options = {"top_k": 2, "dtype": "float16", "summaries": ["self", "first"]}
    by_options = sdk_client.encode(seqs, return_attention=True, attention_options=options)
    assert by_keywords.attention is not None and by_options.attention is not None
    assert by_keywords.attention_indices is not None and by_options.attention_indices is not None
    for a, b, i, j in zip(
        by_keywords.attention,
        by_options.attention,
        by_keywords.attention_indices,
        by_options.attention_indices,
        strict=True,
    ):
        assert a.dtype == np.float16 and a.shape[-1] == 2
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(i, j)
    assert by_keywords.attention_summaries is not None
    assert [list(s) for s in by_keywords.attention_summaries] == [["self", "first"]] * 2
    # Mixed: a keyword beside other entries of attention_options.
    mixed = sdk_client.encode(
        seqs, return_attention=True, top_k=2, attention_options={"dtype": "float16"}
    )
    assert mixed.attention is not None
    np.testing.assert_array_equal(mixed.attention[0], by_options.attention[0])


def test_an_option_given_both_ways_is_refused_before_sending(sdk_client: Client) -> None:
    seqs = sequences((3,), seed=6)
    with pytest.raises(ValueError, match="top_k given both as a keyword and in attention_opt"):
        sdk_client.encode(seqs, return_attention=True, top_k=2, attention_options={"top_k": 3})


def test_results_read_as_lists() -> None:
    """Iteration, len and indexing (slices too) go to the listed field."""
    vectors = [SparseVector([1], [0.5]), SparseVector([2, 3], [0.1, 0.2])]
    result = SparseResult("m", vectors, Usage(2, 5))
    assert list(result) == vectors and len(result) == 2
    assert result[1] is vectors[1] and result[-1] is vectors[1] and result[:1] == vectors[:1]
