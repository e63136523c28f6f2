"""sentence-transformers model folders: their pooling, normalisation and prompts, served.

Three folders built by sentence-transformers itself from the all-MiniLM-L6-v2
weights (``SentenceTransformer(modules=[...]).save``), each with prompts and a
default prompt, exported and served by one real server:

- ``cls``: CLS pooling, its ``1_Pooling/config.json`` rewritten in the older
  ``pooling_mode_*`` flags most folders on the Hub carry;
- ``last``: last-token pooling (``pooling_mode: lasttoken``, as 6.x writes it);
- ``apart``: mean pooling with ``include_prompt: false`` (INSTRUCTOR-style): the
  prompt's tokens, [CLS] with them, are left out of the mean.

The reference is ``SentenceTransformer(folder).encode(texts, prompt_name=...)`` on
the same folder (texts of ragged lengths, so its batch is padded): served vectors
equal it within 1e-5 on /v1/encode, /v1/embeddings and (the default model, which
TEI's routes serve) TEI's /embed. Each folder
also has a control: what serving it the old way (mean pooling, prompt pooled in)
would give is far from the reference, so the equality tests the recipe.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules.normalize import Normalize
from sentence_transformers.base.modules.transformer import Transformer
from sentence_transformers.sentence_transformer.modules.pooling import Pooling as STPooling

from model_export.hf_import import CheckpointError, minilm_l6_dir
from model_export.manifest import Manifest
from model_export.st_folder import sentence_recipe
from service.engine.types import ServingLimits
from service.model_info import ModelInfo
from service.protocols.tei import codec as tei_codec
from tests.conftest import running_server

PROMPTS = {"query": "query: ", "passage": "Represent this passage for retrieval: "}
# Ragged on purpose: sentence-transformers pads its batch (right padding), we do not.
TEXTS = [
    "how long do tulips bloom",
    "Tulips bloom for one to two weeks in spring, longer where the weather stays cool.",
    "bulbs",
]
ATOL = 1e-5
# name -> (sentence-transformers' pooling mode, include_prompt, ours)
FOLDERS = {
    "cls": ("cls", True, "cls"),
    "last": ("lasttoken", True, "last"),
    "apart": ("mean", False, "mean"),
}
PROMPT_NAMES = [None, "query", "passage"]
DEFAULT = "apart"  # the server's default model: the one TEI's routes serve


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each folder as sentence-transformers saves it (nothing downloads: local weights)."""
    root = tmp_path_factory.mktemp("st-folders")
    made = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        for name, (mode, include_prompt, _) in FOLDERS.items():
            model = SentenceTransformer(
                modules=[
                    Transformer(str(minilm_l6_dir())),
                    STPooling(384, pooling_mode=mode, include_prompt=include_prompt),
                    Normalize(),
                ],
                prompts=PROMPTS,
                default_prompt_name="query",
                device="cpu",
            )
            model.save(str(root / name))
            made[name] = root / name
    legacy = made["cls"] / "1_Pooling" / "config.json"
    legacy.write_text(
        json.dumps(
            {
                "word_embedding_dimension": 384,
                "pooling_mode_cls_token": True,
                "pooling_mode_mean_tokens": False,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
            }
        )
    )
    return made


@pytest.fixture(scope="module")
def repo(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_export.cli import main

    repo = tmp_path_factory.mktemp("st-models")
    for name, source in folders.items():
        command = ["--checkpoint", str(source), "--name", name, "--out", str(repo / name)]
        assert main([*command, "--no-compact-attention"]) == 0  # CI time; not what is tested
    return repo


@pytest.fixture(scope="module")
def url(repo: Path) -> Iterator[str]:
    with running_server(repo, intra_op_threads="2", default_model=DEFAULT) as running:
        yield running


@pytest.fixture(scope="module")
def st_models(folders: dict[str, Path]) -> dict[str, SentenceTransformer]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        return {
            name: SentenceTransformer(str(path), device="cpu") for name, path in folders.items()
        }


def st_encode(model: SentenceTransformer, prompt_name: str | None) -> np.ndarray:
    kwargs = {} if prompt_name is None else {"prompt_name": prompt_name}
    return np.asarray(model.encode(TEXTS, **kwargs))


def prompt_option(prompt_name: str | None) -> dict[str, str]:
    return {} if prompt_name is None else {"prompt_name": prompt_name}


def served(url: str, name: str, prompt_name: str | None) -> dict[str, np.ndarray]:
    """The folder's vectors from /v1/encode (its pooling named), /v1/embeddings and, for
    the default model, TEI's /embed."""
    option = prompt_option(prompt_name)
    encode = httpx.post(
        f"{url}/v1/encode",
        json={
            "model": name,
            "inputs": TEXTS,
            "pooling": FOLDERS[name][2],
            "normalize": True,
            **option,
        },
        timeout=60,
    )
    embeddings = httpx.post(
        f"{url}/v1/embeddings", json={"model": name, "input": TEXTS, **option}, timeout=60
    )
    for answer in (encode, embeddings):
        assert answer.status_code == 200, answer.text
    vectors = {
        "encode": np.array([item["pooled"] for item in encode.json()["data"]]),
        "embeddings": np.array([item["embedding"] for item in embeddings.json()["data"]]),
    }
    if name == DEFAULT:
        tei = httpx.post(f"{url}/embed", json={"inputs": TEXTS, **option}, timeout=60)
        assert tei.status_code == 200, tei.text
        vectors["tei"] = np.array(tei.json())
    return vectors


def test_folders_export_their_recipe(repo: Path) -> None:
    for name, (_, include_prompt, ours) in FOLDERS.items():
        manifest = Manifest.read(repo / name)
        assert (manifest.pooling, manifest.normalize) == (ours, True)
        assert manifest.include_prompt is include_prompt
        assert manifest.default_prompt_name == "query"
        assert {k: v for k, v in manifest.prompts.items() if k in PROMPTS} == PROMPTS


@pytest.mark.parametrize("prompt_name", PROMPT_NAMES)
@pytest.mark.parametrize("name", list(FOLDERS))
def test_served_vectors_equal_sentence_transformers(
    url: str, st_models: dict[str, SentenceTransformer], name: str, prompt_name: str | None
) -> None:
    want = st_encode(st_models[name], prompt_name)
    for route, got in served(url, name, prompt_name).items():
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=route)


def test_the_old_way_would_differ(url: str, st_models: dict[str, SentenceTransformer]) -> None:
    """The controls: mean pooling (what a folder pooling otherwise was served with) and
    the prompt pooled in (what include_prompt false was refused for) are far from each
    folder's own vectors, so the equality above tests the recipe."""
    for name in ("cls", "last"):
        mean = httpx.post(
            f"{url}/v1/encode",
            json={"model": name, "inputs": TEXTS, "pooling": "mean", "normalize": True},
            timeout=60,
        )
        assert mean.status_code == 200, mean.text
        vectors = np.array([item["pooled"] for item in mean.json()["data"]])
        assert np.abs(vectors - st_encode(st_models[name], None)).max() > 0.05, name
    apart = st_models["apart"]
    want = st_encode(apart, "passage")
    apart.set_pooling_include_prompt(True)
    try:
        pooled_in = st_encode(apart, "passage")
    finally:
        apart.set_pooling_include_prompt(False)
    assert np.abs(pooled_in - want).max() > 0.01


def test_prompt_tokens_are_left_out_of_pooling_only(url: str) -> None:
    """include_prompt false: the token outputs still cover every token, the prompt's
    included; the pooled vector is the mean of those after it ([CLS] and the prompt)."""
    answer = httpx.post(
        f"{url}/v1/encode",
        json={
            "model": "apart",
            "inputs": TEXTS[:1],
            "pooling": "mean",
            "return_embeddings": True,
            "return_attention": True,
            "prompt_name": "query",
        },
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    item = answer.json()["data"][0]
    assert item["tokens"][:3] == ["[CLS]", "query", ":"]
    tokens = np.array(item["embeddings"])
    n = len(item["tokens"])
    assert tokens.shape == (n, 384) and np.array(item["attention"]).shape[-2:] == (n, n)
    np.testing.assert_allclose(item["pooled"], tokens[3:].mean(axis=0), rtol=0, atol=1e-6)
    assert np.abs(tokens.mean(axis=0) - tokens[3:].mean(axis=0)).max() > 1e-3


def test_cls_after_a_prompt_left_out_is_the_first_text_token(url: str) -> None:
    """sentence-transformers' CLS pooling takes the first token pooling keeps: with a
    prompt left out, the first token of the text, not [CLS] (as its Pooling does)."""
    answer = httpx.post(
        f"{url}/v1/encode",
        json={
            "model": "apart",
            "inputs": TEXTS[:1],
            "pooling": "cls",
            "return_embeddings": True,
            "prompt": "query: ",
        },
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    item = answer.json()["data"][0]
    np.testing.assert_allclose(item["pooled"], item["embeddings"][3], rtol=0, atol=1e-6)


def test_models_list_prompts(url: str) -> None:
    cards = {card["name"]: card for card in httpx.get(f"{url}/v1/models").json()["data"]}
    apart = cards["apart"]
    assert apart["prompts"]["passage"] == PROMPTS["passage"]
    assert (apart["default_prompt_name"], apart["include_prompt"]) == ("query", False)
    assert (cards["last"]["pooling"], cards["last"]["include_prompt"]) == ("last", True)
    one = httpx.get(f"{url}/v1/models/apart").json()
    assert (one["prompts"], one["include_prompt"]) == (apart["prompts"], False)
    info = httpx.get(f"{url}/info").json()
    assert (info["model_id"], info["model_type"]) == ("apart", {"embedding": {"pooling": "mean"}})


def test_tei_info_names_last_token_pooling_as_tei_does(repo: Path) -> None:
    """TEI's /info writes its last-token pooling ``last_token``."""
    model = ModelInfo(Manifest.read(repo / "last"), repo / "last", max_seq_len=256, created=0)
    answer = tei_codec.info(model, ServingLimits(1, 1, 1, 1), model.default_pooling)
    assert answer["model_type"] == {"embedding": {"pooling": "last_token"}}


# -- reading 1_Pooling/config.json -------------------------------------------------------


def recipe_of(tmp_path: Path, pooling: dict[str, object]) -> tuple[str | None, bool]:
    (tmp_path / "1_Pooling").mkdir(exist_ok=True)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    recipe = sentence_recipe(tmp_path)
    return recipe.pooling, recipe.include_prompt


def test_both_forms_of_the_pooling_config_are_read(tmp_path: Path) -> None:
    assert recipe_of(tmp_path, {"pooling_mode_lasttoken": True}) == ("last", True)
    assert recipe_of(tmp_path, {"pooling_mode_max_tokens": True}) == ("max", True)
    assert recipe_of(tmp_path, {"pooling_mode": "cls", "include_prompt": False}) == (
        "cls",
        False,
    )
    # No mode on: sentence-transformers pools by mean.
    assert recipe_of(tmp_path, {"pooling_mode_cls_token": False}) == ("mean", True)
    assert sentence_recipe(tmp_path / "nowhere").pooling is None


@pytest.mark.parametrize(
    "pooling",
    [
        {"pooling_mode_mean_sqrt_len_tokens": True},
        {"pooling_mode": "weightedmean"},
        {"pooling_mode": ["cls", "mean"]},
        {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True},
    ],
)
def test_poolings_we_do_not_serve_are_refused_not_replaced(
    tmp_path: Path, pooling: dict[str, object]
) -> None:
    """Served as another pooling, such a model would answer vectors unlike its own."""
    with pytest.raises(CheckpointError, match="does not serve"):
        recipe_of(tmp_path, pooling)


def test_the_original_minilm_folder_keeps_its_recipe() -> None:
    """all-MiniLM-L6-v2 as published (older flags, mean, Normalize)."""
    recipe = sentence_recipe(minilm_l6_dir())
    assert (recipe.pooling, recipe.normalize, recipe.include_prompt) == ("mean", True, True)


def test_a_prompt_that_fills_the_window_is_a_422_naming_it(url: str) -> None:
    """``include_prompt: false`` with a prompt of the whole window (truncated texts keep
    only the prompt and [SEP]): there is none of the text left to pool. Before, every
    text got the same [SEP] vector with 200."""
    body = {
        "model": "apart",
        "inputs": ["tulips bloom in spring", "the stock market fell"],
        # 600 one-token words, past the folder's 512 (prompts are at most 2,048 characters)
        "prompt": "a " * 600,
        "pooling": "mean",
        "truncate": True,
    }
    refused = httpx.post(f"{url}/v1/encode", json=body, timeout=60)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"].startswith("prompt: the prompt's 511 tokens"), refused.text
    # Without truncation it is refused before any text is tokenized, naming the prompt.
    whole = httpx.post(f"{url}/v1/encode", json={**body, "truncate": False}, timeout=60)
    assert whole.status_code == 413, whole.text
    assert whole.json()["error"].startswith("prompt: the prompt is 602 tokens"), whole.text
