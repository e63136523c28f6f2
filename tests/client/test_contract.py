"""Contract: the SDK's result types parse every response shape the server's OpenAPI allows.

The schema is the real server's ``/openapi.json``. Sample bodies cover each
alternative of every ``anyOf`` there (nested floats, Base64Array objects with
and without ``dtype``, null); each sample is first validated against the
component schema, then parsed by the SDK, and the parsed arrays are compared
exactly (atol 0: the samples hold float32 values, which JSON and base64 both
carry without loss). A test also checks that the samples reach every
alternative, so a new one in the schema fails here until the SDK is tested on it.

Validation is ``jsonschema``'s (JSON Schema 2020-12, which OpenAPI 3.1 schemas
are); :class:`Validator` only records which ``anyOf`` branches a valid body takes.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import numpy as np
import pytest

from attnserve_client import EncodeResult, ModelCard, TokenizeResult
from tests.support.tiny import MODEL

Schema = dict[str, Any]
Body = dict[str, Any]


class Validator:
    """A component schema of this OpenAPI document, validated by ``jsonschema``, recording
    the anyOf branches each valid body takes (for the coverage test below)."""

    def __init__(self, components: dict[str, Schema]) -> None:
        self.components = components
        self.branches: set[tuple[str, int]] = set()  # (anyOf location, branch) seen valid

    def validator(self, schema: Schema) -> jsonschema.Draft202012Validator:
        # The components ride along, so "#/components/schemas/..." resolves from any schema.
        return jsonschema.Draft202012Validator(
            {**schema, "components": {"schemas": self.components}}
        )

    def errors(self, value: Any, component: str) -> list[str]:
        """Every violation of the component's schema by ``value``, as jsonschema words it,
        with the reasons each anyOf branch failed."""
        found: list[str] = []
        todo = list(self.validator(self.components[component]).iter_errors(value))
        while todo:
            error = todo.pop(0)
            found.append(f"{error.json_path}: {error.message}")
            todo.extend(error.context or [])
        return found

    def check(self, value: Any, component: str) -> None:
        problems = self.errors(value, component)
        assert not problems, problems
        self.record(value, self.components[component], component)

    def record(self, value: Any, schema: Schema, at: str) -> None:
        """Walk a valid ``value`` along ``schema``, noting each anyOf branch it satisfies
        (named as :func:`every_anyof` names them)."""
        if "$ref" in schema:
            ref = schema["$ref"]
            self.record(value, self.components[ref.rsplit("/", 1)[1]], ref)
        for i, branch in enumerate(schema.get("anyOf", [])):
            if self.validator(branch).is_valid(value):
                self.branches.add((at, i))
                self.record(value, branch, f"{at}/anyOf/{i}")
        if isinstance(value, dict):
            props = schema.get("properties", {})
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                if key in props:
                    self.record(item, props[key], f"{at}/{key}")
                elif isinstance(extra, dict):
                    self.record(item, extra, f"{at}/*")
        if isinstance(value, list) and "items" in schema:
            for item in value:
                self.record(item, schema["items"], f"{at}/items")


def every_anyof(components: dict[str, Schema], component: str) -> set[tuple[str, int]]:
    """Every (anyOf location, branch) reachable from a component, in the validator's naming."""
    found: set[tuple[str, int]] = set()

    def walk(schema: Schema, at: str, seen: frozenset[str]) -> None:
        if "$ref" in schema and schema["$ref"] not in seen:
            ref = schema["$ref"]
            walk(components[ref.rsplit("/", 1)[1]], ref, seen | {ref})
        for i, branch in enumerate(schema.get("anyOf", [])):
            found.add((at, i))
            walk(branch, f"{at}/anyOf/{i}", seen)
        for key, prop in schema.get("properties", {}).items():
            walk(prop, f"{at}/{key}", seen)
        if isinstance(schema.get("additionalProperties"), dict):
            walk(schema["additionalProperties"], f"{at}/*", seen)
        if "items" in schema:
            walk(schema["items"], f"{at}/items", seen)

    walk(components[component], component, frozenset())
    return found


@pytest.fixture(scope="module")
def components(server_url: str) -> dict[str, Schema]:
    r = httpx.get(f"{server_url}/openapi.json", timeout=30.0)
    assert r.status_code == 200
    schemas: dict[str, Schema] = r.json()["components"]["schemas"]
    return schemas


# --- sample bodies -------------------------------------------------------------------------

RNG = np.random.default_rng(0)
EMB = [RNG.standard_normal((n, 3), dtype=np.float32) for n in (2, 1, 3)]  # [n_i, d]
ATT = [RNG.random((2, 1, n, n), dtype=np.float32) for n in (2, 1, 3)]  # [L', H', n, n]
POOL = [RNG.standard_normal(3, dtype=np.float32) for _ in range(3)]  # [d]
HID = [RNG.standard_normal((2, n, 3), dtype=np.float32) for n in (2, 1, 3)]  # [L'', n_i, d]
SPANS = [RNG.standard_normal((k, 3), dtype=np.float32) for k in (1, 2, 1)]  # [n_spans, d]
# Compact attention: each row's kept keys [L', H', n, k] and summaries by name [L', H'].
KEYS = [RNG.integers(0, n, (2, 1, n, 1)).astype(np.int32) for n in (2, 1, 3)]
SUMMARIES = [{"entropy": RNG.random((2, 1), dtype=np.float32)} for _ in range(3)]


def b64(array: np.ndarray, *, dtype: bool = True) -> Body:
    obj: Body = {
        "shape": list(array.shape),
        "data": base64.b64encode(array.astype("<f4").tobytes()).decode("ascii"),
    }
    if dtype:  # optional in the schema (default float32)
        obj["dtype"] = "float32"
    return obj


def floats(array: np.ndarray) -> Any:
    return array.tolist()  # Python floats holding float32 values exactly


def wire(kind: str, array: np.ndarray) -> Any:
    return {"float": floats, "base64": b64, "base64-no-dtype": lambda a: b64(a, dtype=False)}[kind](
        array
    )


def encode_body(kinds: dict[str, str | None], *, tokens: str = "null") -> Body:
    """Three items; ``kinds[field]`` is float, base64, base64-no-dtype, or None for null."""
    arrays = {
        "embeddings": EMB,
        "attention": ATT,
        "hidden_states": HID,
        "pooled": POOL,
        "span_embeddings": SPANS,
    }
    items = []
    for i in range(3):
        item: Body = {"index": i}
        if tokens == "list":
            item["tokens"] = ["[CLS]", "x", "[SEP]"][: len(EMB[i])]
        elif tokens == "null":
            item["tokens"] = None  # "absent" leaves the optional key out
        for name, values in arrays.items():
            kind = kinds.get(name)
            item[name] = None if kind is None else wire(kind, values[i])
        item["attention_indices"] = item["attention_summaries"] = None  # as the server writes
        kind = kinds.get("attention_indices")
        if kind is not None:
            raw = base64.b64encode(KEYS[i].astype("<i4").tobytes()).decode("ascii")
            as_b64 = {"shape": list(KEYS[i].shape), "dtype": "int32", "data": raw}
            item["attention_indices"] = KEYS[i].tolist() if kind == "float" else as_b64
        kind = kinds.get("attention_summaries")
        if kind is not None:
            item["attention_summaries"] = {k: wire(kind, v) for k, v in SUMMARIES[i].items()}
        items.append(item)
    items.reverse()  # the schema does not order data; the SDK must order by index
    return {"model": MODEL, "data": items, "usage": {"sequences": 3, "tokens": 6}}


ENCODE_CASES: dict[str, tuple[dict[str, str | None], str]] = {
    "float": (
        {
            "embeddings": "float",
            "attention": "float",
            "hidden_states": "float",
            "pooled": "float",
            "span_embeddings": "float",
        },
        "null",
    ),
    "base64": (
        {"embeddings": "base64", "attention": "base64", "hidden_states": "base64"},
        "list",
    ),
    "base64-no-dtype": (
        {
            "embeddings": "base64-no-dtype",
            "attention": "base64-no-dtype",
            "pooled": None,
            "span_embeddings": "base64-no-dtype",
        },
        "absent",
    ),
    "spans-base64": ({"pooled": "base64", "span_embeddings": "base64"}, "list"),
    "embeddings-only": ({"embeddings": "float"}, "null"),
    "pooled-only": ({"pooled": "base64"}, "list"),
    "attention-only": ({"attention": "float"}, "absent"),
    "hidden-states-only": ({"hidden_states": "base64-no-dtype"}, "absent"),
    "all-null": ({}, "null"),
    "compact-attention-float": (
        {"attention": "float", "attention_indices": "float", "attention_summaries": "float"},
        "null",
    ),
    "compact-attention-base64": (
        {"attention": "base64", "attention_indices": "base64", "attention_summaries": "base64"},
        "absent",
    ),
}


@pytest.mark.parametrize("case", ENCODE_CASES)
def test_encode_response_shapes(components: dict[str, Schema], case: str) -> None:
    kinds, tokens = ENCODE_CASES[case]
    body = encode_body(kinds, tokens=tokens)
    Validator(components).check(body, "EncodeResponse")
    result = EncodeResult.from_json(body)
    assert result.model == MODEL and len(result) == 3 and result.usage.tokens == 6
    if tokens == "list":
        assert result.tokens == [["[CLS]", "x"], ["[CLS]"], ["[CLS]", "x", "[SEP]"]]
    else:
        assert result.tokens == [None, None, None]
    for name, want in (
        ("embeddings", EMB),
        ("attention", ATT),
        ("hidden_states", HID),
        ("pooled", POOL),
        ("span_embeddings", SPANS),
    ):
        got = getattr(result, name)
        if kinds.get(name) is None:
            assert got is None, name
            continue
        assert got is not None
        for g, w in zip(got, want, strict=True):  # in index order
            assert g.dtype == np.float32 and g.shape == w.shape
            np.testing.assert_array_equal(g, w)  # atol 0
    if kinds.get("attention_indices") is None:
        assert result.attention_indices is None
    else:
        assert result.attention_indices is not None
        for g, w in zip(result.attention_indices, KEYS, strict=True):
            assert g.dtype == np.int32
            np.testing.assert_array_equal(g, w)
    if kinds.get("attention_summaries") is None:
        assert result.attention_summaries is None
    else:
        assert result.attention_summaries is not None
        for g, w in zip(result.attention_summaries, SUMMARIES, strict=True):
            assert list(g) == list(w)
            np.testing.assert_array_equal(g["entropy"], w["entropy"])


def test_encode_response_with_no_items(components: dict[str, Schema]) -> None:
    body = {"model": MODEL, "data": [], "usage": {"sequences": 0, "tokens": 0}}
    Validator(components).check(body, "EncodeResponse")
    result = EncodeResult.from_json(body)
    assert len(result) == 0 and result.embeddings is None and result.tokens == []


def tokenize_body(kind: str | None) -> Body:
    items = [
        {
            "index": i,
            "tokens": ["[CLS]", "x", "[SEP]"][: len(EMB[i])],
            "ids": [101, 1060, 102][: len(EMB[i])],
            "embeddings": None if kind is None else wire(kind, EMB[i]),
        }
        for i in range(3)
    ]
    return {"model": MODEL, "data": items[::-1], "usage": {"sequences": 3, "tokens": 6}}


@pytest.mark.parametrize("kind", ["float", "base64", "base64-no-dtype", None])
def test_tokenize_response_shapes(components: dict[str, Schema], kind: str | None) -> None:
    body = tokenize_body(kind)
    Validator(components).check(body, "TokenizeResponse")
    result = TokenizeResult.from_json(body)
    assert result.tokens == [["[CLS]", "x"], ["[CLS]"], ["[CLS]", "x", "[SEP]"]]
    assert result.ids == [[101, 1060], [101], [101, 1060, 102]]
    if kind is None:
        assert result.embeddings is None
    else:
        assert result.embeddings is not None
        for g, w in zip(result.embeddings, EMB, strict=True):
            np.testing.assert_array_equal(g, w)  # atol 0


def card_body(window: int | None, tokenizer: bool) -> Body:
    return {
        # OpenAI's model object (the openai client's models.list() reads these)
        "id": "m",
        "object": "model",
        "created": 1_700_000_000,
        "owned_by": "attnserve",
        "name": "m",
        "d_model": 384,
        "dimensions": 384,
        "heads": 12,
        "layers": 6,
        "d_ff": 1536,
        "max_seq_len": 512,
        "max_seq_len_by": "the model",
        "causal": window is not None,
        "window": window,
        "scoring": "dot",
        "norm_placement": "post",
        "activation": "gelu",
        "opset": 18,
        "sha256": {"model.onnx": "0" * 64, "model_attn.onnx": "1" * 64},
        "tokenizer": tokenizer,
        "pooling": "mean" if tokenizer else None,
        "normalize": tokenizer,
        "hidden_states": tokenizer,
        "matryoshka_dimensions": [384, 128] if tokenizer else [],
        "prompts": {"query": "query: "} if tokenizer else {},
        "default_prompt_name": "query" if tokenizer else None,
        "include_prompt": tokenizer,
        "task": "embed" if tokenizer else "classify",
        "labels": [] if tokenizer else ["no", "yes"],
        "tasks": ["retrieval.query", "text-matching"] if tokenizer else [],
        "default_task": "retrieval.query" if tokenizer else None,
        "default": not tokenizer,
    }


@pytest.mark.parametrize(("window", "tokenizer"), [(None, True), (4, False)])
def test_model_card_shapes(
    components: dict[str, Schema], window: int | None, tokenizer: bool
) -> None:
    body = card_body(window, tokenizer)
    validator = Validator(components)
    validator.check(body, "ModelCard")
    validator.check({"object": "list", "data": [body, body]}, "ModelList")
    card = ModelCard.from_json(body)
    assert (card.name, card.d_model, card.heads, card.layers, card.max_seq_len) == (
        "m",
        384,
        12,
        6,
        512,
    )
    assert (card.tokenizer, card.default) == (tokenizer, not tokenizer)
    assert card.task == ("embed" if tokenizer else "classify")
    assert card.max_seq_len_by == "the model"
    assert card.raw["window"] == window


def all_samples() -> dict[str, list[Body]]:
    return {
        "EncodeResponse": [encode_body(k, tokens=t) for k, t in ENCODE_CASES.values()],
        "TokenizeResponse": [tokenize_body(k) for k in ("float", "base64", None)],
        "ModelCard": [card_body(None, True), card_body(4, False)],
    }


@pytest.mark.parametrize("component", ["EncodeResponse", "TokenizeResponse", "ModelCard"])
def test_samples_cover_every_alternative(components: dict[str, Schema], component: str) -> None:
    validator = Validator(components)
    for body in all_samples()[component]:
        validator.check(body, component)
    missing = every_anyof(components, component) - validator.branches
    assert not missing, f"no sample takes these anyOf branches: {sorted(missing)}"


def test_real_responses_fit_the_schema(components: dict[str, Schema], server_url: str) -> None:
    """What the server really sends validates, so the samples above are not made up."""
    validator = Validator(components)
    seq = np.ones((3, 32), np.float32).tolist()
    with httpx.Client(base_url=server_url, timeout=30.0) as http:
        for fmt in ("float", "base64"):
            body = {"inputs": [seq], "encoding_format": fmt, "return_attention": True}
            r = http.post("/v1/encode", json={**body, "pooling": "mean", "return_embeddings": True})
            assert r.status_code == 200, r.text
            validator.check(r.json(), "EncodeResponse")
        validator.check(http.get("/v1/models").json(), "ModelList")
        validator.check(http.get(f"/v1/models/{MODEL}").json(), "ModelCard")


BAD: list[tuple[str, str, Callable[[Body], None]]] = [
    ("EncodeResponse", "'usage' is a required property", lambda b: b.pop("usage")),
    ("EncodeResponse", "is not of type 'integer'", lambda b: b["data"][0].update(index="0")),
    (
        "EncodeResponse",
        "Additional properties are not allowed ('order' was unexpected)",
        lambda b: b["data"][0]["embeddings"].update(order="C"),
    ),
    (
        "EncodeResponse",
        "'float64' is not one of",
        lambda b: b["data"][0]["embeddings"].update(dtype="float64"),
    ),
    (
        "EncodeResponse",
        "is not valid under any of the given schemas",
        lambda b: b["data"][0].update(pooled="1,2,3"),
    ),
    (
        "EncodeResponse",
        "is not valid under any of the given schemas",
        lambda b: b["data"][0].update(attention=[[1.0]]),
    ),
]


@pytest.mark.parametrize(("component", "says", "break_it"), BAD)
def test_schema_refuses_what_it_forbids(
    components: dict[str, Schema], component: str, says: str, break_it: Callable[[Body], None]
) -> None:
    """The samples are checked by a schema that can fail: each broken body is refused, for
    the right reason."""
    body = encode_body({"embeddings": "base64", "attention": "float", "pooled": None})
    Validator(components).check(body, component)
    break_it(body)
    problems = Validator(components).errors(body, component)
    assert any(says in p for p in problems), problems
