"""sentence-transformers' prompts: read from the model folder, asked for by name.

A copy of all-MiniLM-L6-v2 whose ``config_sentence_transformers.json`` declares
``query: `` and ``passage: `` prompts (``query`` the default), as E5-style
models do. sentence-transformers' ``encode(text, prompt_name=...)`` prepends the
prompt to the text, tokenizes, pools and normalises; the reference is
``SentenceTransformer`` itself on the same folder, within 1e-5. The prompt is
asked for by name on every protocol that takes text for vectors (native,
OpenAI's extra body field, TEI). Folders with other poolings and with
``include_prompt: false``: ``test_st_folders.py``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from sentence_transformers import SentenceTransformer

from model_export.hf_import import minilm_l6_dir
from tests.conftest import running_server

MODEL = "prompted"
PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = ["how long do tulips bloom", "Tulips bloom for one to two weeks in spring."]
ATOL = 1e-5


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """all-MiniLM-L6-v2's folder with prompts added to its sentence-transformers config."""
    source = tmp_path_factory.mktemp("prompted-ckpt") / "ckpt"
    shutil.copytree(minilm_l6_dir(), source)
    st_config = source / "config_sentence_transformers.json"
    config = json.loads(st_config.read_text()) if st_config.is_file() else {}
    st_config.write_text(json.dumps({**config, "prompts": PROMPTS, "default_prompt_name": "query"}))
    return source


@pytest.fixture(scope="module")
def url(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from model_export.cli import main

    repo = tmp_path_factory.mktemp("prompted-models")
    command = ["--checkpoint", str(source), "--name", MODEL, "--out", str(repo / MODEL)]
    assert main([*command, "--no-compact-attention"]) == 0  # CI time; not what is tested
    manifest = json.loads((repo / MODEL / "config.json").read_text())
    assert (manifest["prompts"], manifest["default_prompt_name"]) == (PROMPTS, "query")
    with running_server(repo, intra_op_threads="2") as running:
        yield running


@pytest.fixture(scope="module")
def st_model(source: Path) -> SentenceTransformer:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")  # a local folder: nothing to download
        return SentenceTransformer(str(source), device="cpu")


def reference(model: SentenceTransformer, prompt_name: str) -> np.ndarray:
    """sentence-transformers' own vectors of TEXTS with the named prompt."""
    return np.asarray(model.encode(TEXTS, prompt_name=prompt_name))


def native(url: str, **options: object) -> httpx.Response:
    body = {"model": MODEL, "inputs": TEXTS, "pooling": "mean", "normalize": True, **options}
    return httpx.post(f"{url}/v1/encode", json=body, timeout=60)


def vectors(answer: httpx.Response) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.array([item["pooled"] for item in answer.json()["data"]])


@pytest.mark.parametrize("name", ["query", "passage"])
def test_a_named_prompt_is_prepended_as_sentence_transformers_does(
    url: str, st_model: SentenceTransformer, name: str
) -> None:
    prompted = [PROMPTS[name] + text for text in TEXTS]
    answer = native(url, prompt_name=name)
    np.testing.assert_allclose(vectors(answer), reference(st_model, name), rtol=0, atol=ATOL)
    # The same as sending the prompted texts with no prompt at all (prompt "").
    bare = httpx.post(
        f"{url}/v1/encode",
        json={
            "model": MODEL,
            "inputs": prompted,
            "pooling": "mean",
            "normalize": True,
            "prompt": "",
        },
        timeout=60,
    )
    np.testing.assert_allclose(vectors(answer), vectors(bare), rtol=0, atol=1e-6)


def test_the_default_prompt_applies_unless_the_request_says_otherwise(url: str) -> None:
    default = vectors(native(url))
    np.testing.assert_allclose(default, vectors(native(url, prompt_name="query")), atol=1e-6)
    # The control: another prompt gives other vectors, so the default did apply.
    assert not np.allclose(default, vectors(native(url, prompt_name="passage")), atol=1e-3)
    own = vectors(native(url, prompt="passage: "))
    np.testing.assert_allclose(own, vectors(native(url, prompt_name="passage")), atol=1e-6)


def test_openai_and_tei_clients_name_the_prompt(url: str, st_model: SentenceTransformer) -> None:
    want = reference(st_model, "passage")
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused") as client:  # closes its socket
        got = client.embeddings.create(
            model=MODEL, input=TEXTS, extra_body={"prompt_name": "passage"}
        )
    np.testing.assert_allclose([d.embedding for d in got.data], want, rtol=0, atol=ATOL)
    tei = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "prompt_name": "passage"}, timeout=60)
    assert tei.status_code == 200, tei.text
    np.testing.assert_allclose(tei.json(), want, rtol=0, atol=ATOL)


def test_prompt_mistakes_are_422_naming_what_exists(url: str) -> None:
    unknown = native(url, prompt_name="document")
    assert unknown.status_code == 422, unknown.text
    assert "'query', 'passage'" in unknown.json()["error"], unknown.text
    both = native(url, prompt_name="query", prompt="q: ")
    assert both.status_code == 422 and "not both" in both.json()["error"], both.text
    arrays = httpx.post(
        f"{url}/v1/encode",
        json={"model": MODEL, "inputs": [[[0.5] * 384] * 2], "prompt_name": "query"},
        timeout=60,
    )
    assert arrays.status_code == 422 and "text inputs" in arrays.json()["error"], arrays.text
