"""The attention viewer in a real Chromium against a real server: what a person sees and does.

Weights read off the page are compared with the same request made over HTTP
(tolerance 1e-6: the page shows the float32 the server sent, as a JS number).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import numpy as np
import pytest
from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.actions.action_builder import ActionBuilder
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select

from model_export.config import preset
from model_export.export import export_model
from model_export.hf_import import minilm_l6_dir
from model_export.model import Encoder, TokenEmbeddings
from tests.browser.conftest import (
    assert_only_local_requests,
    posted_bodies,
    screenshot,
    wait_for_script,
)
from tests.conftest import running_server

TEXT = "The cat sat on the mat."
TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
RENDERED = "document.getElementById('stage').dataset.state === 'ready'"
WEIGHT_TOLERANCE = 1e-6
SUMMARIES = ["entropy", "first", "self", "previous", "next", "distance"]
KEY = "sesame"
BEARER = {"Authorization": f"Bearer {KEY}"}


def api_attention(
    url: str, inputs: list, attention: dict, model: str, headers: dict[str, str] | None = None
) -> np.ndarray:
    """The maps the page should show, asked for over HTTP: [L', H', n, n]."""
    body = {
        "model": model,
        "inputs": inputs,
        "return_embeddings": False,
        "return_attention": True,
        "attention": attention,
    }
    answer = httpx.post(f"{url}/v1/encode", json=body, headers=headers, timeout=60)
    answer.raise_for_status()
    return np.asarray(answer.json()["data"][0]["attention"], dtype=np.float32)


def open_view(driver: webdriver.Chrome, url: str, **params: str) -> None:
    query = "&".join(f"{k}={quote(v)}" for k, v in params.items())
    driver.get(f"{url}/viewer?{query}")
    wait_for_script(driver, RENDERED)


def url_params(driver: webdriver.Chrome) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(driver.current_url).query).items()}


def labels(driver: webdriver.Chrome, axis: str) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, f".{axis} .tok")]


def hover_cell(driver: webdriver.Chrome, canvas: WebElement, i: int, j: int) -> dict[str, str]:
    """Move the real mouse over cell (query i, key j); return the readout's data."""
    cell = int(canvas.get_attribute("data-cell") or 0)
    width, height = canvas.size["width"], canvas.size["height"]
    x, y = int((j + 0.5) * cell - width / 2), int((i + 0.5) * cell - height / 2)
    ActionChains(driver).move_to_element_with_offset(canvas, x, y).perform()
    readout = driver.find_element(By.ID, "readout")
    wait_for_script(driver, f"document.getElementById('readout').dataset.query === '{i}'")
    return {k: readout.get_attribute(f"data-{k}") or "" for k in ("query", "key", "weight")}


@pytest.fixture(scope="module")
def minilm(minilm_server_url: str) -> str:
    return minilm_server_url


def test_deep_link_renders_one_head_with_labels_hover_and_highlight(
    browser: webdriver.Chrome, minilm: str
) -> None:
    open_view(browser, minilm, text=TEXT, model="minilm-l6", layer="2", head="3", view="head")
    canvas = browser.find_element(By.ID, "heatmap")
    n, cell = int(canvas.get_attribute("data-n") or 0), int(canvas.get_attribute("data-cell") or 0)
    assert n == len(TOKENS)
    assert canvas.get_property("width") == canvas.get_property("height") == n * cell
    assert labels(browser, "queries") == labels(browser, "keys") == TOKENS
    assert browser.find_element(By.ID, "layer").get_property("value") == "2"
    assert browser.find_element(By.ID, "head").get_property("value") == "3"
    assert browser.find_element(By.CSS_SELECTOR, "input[value=head]").is_selected()
    assert len(browser.find_elements(By.CSS_SELECTOR, ".legend canvas")) == 1  # colour scale

    want = api_attention(minilm, [TEXT], {"layers": [2], "heads": [3]}, "minilm-l6")[0, 0]
    read = hover_cell(browser, canvas, 2, 3)
    assert (read["query"], read["key"]) == ("2", "3")
    assert abs(float(read["weight"]) - want[2, 3]) <= WEIGHT_TOLERANCE
    text = browser.find_element(By.ID, "readout").text
    assert "“cat” (#2)" in text and "“sat” (#3)" in text
    assert browser.find_element(By.ID, "tooltip").is_displayed()

    # Clicking a token highlights its row and column (both of its labels), and says
    # what it attends to most: the argmax of its row.
    browser.find_element(By.CSS_SELECTOR, '.queries .tok[data-index="2"]').click()
    assert browser.execute_script("return document.getElementById('stage').dataset.selected") == "2"
    highlighted = browser.find_elements(By.CSS_SELECTOR, ".tok.selected")
    assert [e.get_attribute("data-index") for e in highlighted] == ["2", "2"]
    ActionChains(browser).move_by_offset(0, -400).perform()  # off the map: the readout returns
    wait_for_script(
        browser, "document.getElementById('readout').textContent.includes('attends most')"
    )
    top = TOKENS[int(np.argmax(want[2]))]
    assert f"attends most to “{top}”" in browser.find_element(By.ID, "readout").text
    # The page asked for exactly one head of one layer.
    (body,) = posted_bodies(browser, "/v1/encode")
    assert body["attention"] == {"layers": [2], "heads": [3], "reduce": "none"}
    assert body["return_embeddings"] is False and body["encoding_format"] == "base64"
    screenshot(browser, "viewer-head")
    assert_only_local_requests(browser, minilm)


def test_the_norms_toggle_asks_for_attention_norms_and_keeps_the_url_in_step(
    browser: webdriver.Chrome, minilm: str
) -> None:
    """A deep link with measure=norms draws α·‖f(x)‖ (the hovered value equals the API's
    norms); unticking goes back to weights, and the URL follows."""
    open_view(
        browser, minilm, text=TEXT, model="minilm-l6", layer="1", head="0", view="head",
        measure="norms",
    )  # fmt: skip
    assert browser.find_element(By.ID, "norms").is_selected()
    (body,) = posted_bodies(browser, "/v1/encode")
    assert body["attention"] == {"layers": [1], "heads": [0], "reduce": "none", "measure": "norms"}
    selection = {"layers": [1], "heads": [0], "measure": "norms"}
    want = api_attention(minilm, [TEXT], selection, "minilm-l6")[0, 0]
    read = hover_cell(browser, browser.find_element(By.ID, "heatmap"), 1, 2)
    assert abs(float(read["weight"]) - want[1, 2]) <= WEIGHT_TOLERANCE * max(1.0, want.max())
    assert url_params(browser)["measure"] == "norms"
    browser.find_element(By.ID, "norms").click()
    wait_for_script(browser, "!location.search.includes('measure')")
    wait_for_script(browser, RENDERED)
    bodies = posted_bodies(browser, "/v1/encode")
    assert bodies[-1]["attention"] == {"layers": [1], "heads": [0], "reduce": "none"}


def test_bm42_weights_of_the_text_as_the_api_gives_them(
    browser: webdriver.Chrome, minilm: str
) -> None:
    open_view(browser, minilm, text=TEXT, model="minilm-l6", view="head")
    browser.find_element(By.ID, "show-bm42").click()
    wait_for_script(browser, "!document.getElementById('bm42').hidden")
    rows = browser.find_elements(By.CSS_SELECTOR, "#bm42-rows tr")
    shown = [r.get_attribute("data-stem") for r in rows]
    body = {"model": "minilm-l6", "inputs": [TEXT], "return_text": True, "truncate": True}
    (item,) = httpx.post(f"{minilm}/v1/embed_sparse", json=body, timeout=60).json()["data"]
    order = sorted(range(len(item["text"])), key=lambda k: -item["values"][k])
    assert shown == [item["text"][k] for k in order]  # largest weight first
    (posted,) = posted_bodies(browser, "/v1/embed_sparse")
    assert posted == body
    assert_only_local_requests(browser, minilm)


def test_grid_click_to_enlarge_then_mean_and_rollout_keep_the_url_in_step(
    browser: webdriver.Chrome, minilm: str
) -> None:
    open_view(browser, minilm, text=TEXT, model="minilm-l6", layer="4", view="grid")
    thumbs = browser.find_elements(By.CSS_SELECTOR, ".thumb canvas")
    assert [t.get_attribute("data-head") for t in thumbs] == [str(h) for h in range(12)]
    screenshot(browser, "viewer-grid")

    browser.find_element(By.CSS_SELECTOR, '.thumb canvas[data-head="7"]').click()
    wait_for_script(browser, "document.getElementById('stage').dataset.view === 'head'")
    wait_for_script(browser, RENDERED)
    assert url_params(browser) | {"text": TEXT} == {
        "text": TEXT,
        "model": "minilm-l6",
        "layer": "4",
        "head": "7",
        "view": "head",
    }
    # One head of a layer whose heads are all on the page already costs no request.
    assert len(posted_bodies(browser, "/v1/encode")) == 1

    browser.find_element(By.CSS_SELECTOR, "input[value=mean]").click()
    wait_for_script(browser, "document.getElementById('stage').dataset.view === 'mean'")
    wait_for_script(browser, RENDERED)
    assert url_params(browser)["view"] == "mean"
    canvas = browser.find_element(By.ID, "heatmap")
    want = api_attention(minilm, [TEXT], {"layers": [4], "reduce": "mean"}, "minilm-l6")[0, 0]
    assert abs(float(hover_cell(browser, canvas, 5, 1)["weight"]) - want[5, 1]) <= WEIGHT_TOLERANCE

    browser.find_element(By.CSS_SELECTOR, "input[value=rollout]").click()
    wait_for_script(browser, "document.getElementById('stage').dataset.view === 'rollout'")
    wait_for_script(browser, RENDERED)
    assert url_params(browser)["view"] == "rollout"
    assert "rollout through layers 0-4" in browser.find_element(By.ID, "status").text
    canvas = browser.find_element(By.ID, "heatmap")
    rollout = {"layers": [0, 1, 2, 3, 4], "reduce": "rollout"}
    want = api_attention(minilm, [TEXT], rollout, "minilm-l6")[0, 0]
    assert abs(float(hover_cell(browser, canvas, 0, 0)["weight"]) - want[0, 0]) <= WEIGHT_TOLERANCE
    screenshot(browser, "viewer-rollout")

    asked = [b["attention"] for b in posted_bodies(browser, "/v1/encode")]
    assert asked == [{"layers": [4], "reduce": "none"}, {"layers": [4], "reduce": "mean"}, rollout]
    assert_only_local_requests(browser, minilm)


def test_keyboard_reads_cells_and_selects_a_token(browser: webdriver.Chrome, minilm: str) -> None:
    open_view(browser, minilm, text=TEXT, model="minilm-l6", layer="-1", head="-1", view="head")
    assert url_params(browser) | {"text": TEXT} == {  # negative indices count from the end
        "text": TEXT,
        "model": "minilm-l6",
        "layer": "5",
        "head": "11",
        "view": "head",
    }
    canvas = browser.find_element(By.ID, "heatmap")
    # The first arrow lands on (0, 0); then two right and one down.
    canvas.send_keys(Keys.ARROW_DOWN, Keys.ARROW_RIGHT, Keys.ARROW_RIGHT, Keys.ARROW_DOWN)
    wait_for_script(browser, "document.getElementById('readout').dataset.query === '1'")
    readout = browser.find_element(By.ID, "readout")
    assert (readout.get_attribute("data-query"), readout.get_attribute("data-key")) == ("1", "2")
    want = api_attention(minilm, [TEXT], {"layers": [5], "heads": [11]}, "minilm-l6")[0, 0]
    assert (
        abs(float(readout.get_attribute("data-weight") or "nan") - want[1, 2]) <= WEIGHT_TOLERANCE
    )
    canvas.send_keys(Keys.ENTER)
    wait_for_script(browser, "document.getElementById('stage').dataset.selected === '1'")


def test_long_text_is_cut_to_the_model_limit_and_scrolls_with_labels(
    browser: webdriver.Chrome, minilm: str
) -> None:
    text = " ".join(f"word{i}" for i in range(200))  # ~600 word pieces; the model takes 256
    open_view(browser, minilm, text=text, model="minilm-l6", layer="0", view="mean")
    canvas = browser.find_element(By.ID, "heatmap")
    assert canvas.get_attribute("data-n") == "256"
    assert canvas.get_property("width") == 256 * int(canvas.get_attribute("data-cell") or 0)
    assert len(labels(browser, "queries")) == 256
    assert "longer text is cut" in browser.find_element(By.ID, "status").text
    scrolls = "const s = document.querySelector('.scroller'); return s.scrollWidth > s.clientWidth"
    assert browser.execute_script(scrolls)
    assert_only_local_requests(browser, minilm)


def test_png_download_holds_the_current_view(browser: webdriver.Chrome, minilm: str) -> None:
    open_view(browser, minilm, text=TEXT, model="minilm-l6", layer="1", head="0", view="head")
    width = int(browser.find_element(By.ID, "heatmap").get_property("width"))
    browser.find_element(By.ID, "download").click()
    downloads: Path = browser.downloads  # type: ignore[attr-defined]
    expected = downloads / "attention-minilm-l6-head-layer1-head0.png"
    deadline = time.monotonic() + 10
    while not (expected.exists() and expected.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    data = expected.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    png_width, png_height = struct.unpack(">II", data[16:24])  # IHDR
    assert png_width > width and png_height > width  # the map plus its labels and colour scale


@pytest.fixture(scope="module")
def keyed_tiny(model_repository: Path) -> Iterator[str]:
    """The tiny model (no tokenizer) behind an API key."""
    with running_server(model_repository, api_key=KEY) as url:
        yield url


def test_api_key_and_npy_upload_for_a_model_without_tokenizer(
    browser: webdriver.Chrome, keyed_tiny: str, tmp_path: Path
) -> None:
    browser.get(f"{keyed_tiny}/viewer?model=tiny&layer=1&view=mean")
    wait_for_script(browser, "document.getElementById('status').dataset.state === 'error'")
    assert "401" in browser.find_element(By.ID, "status").text
    browser.get_log("browser")  # the 401 the page was meant to get is not a console error

    key = browser.find_element(By.ID, "api-key")
    key.send_keys(KEY)
    browser.find_element(By.TAG_NAME, "h1").click()  # leaving the field commits it
    wait_for_script(browser, "document.getElementById('model').options.length > 0")
    assert browser.execute_script("return sessionStorage.getItem('attnserve.apiKey')") == KEY
    assert not browser.find_element(By.ID, "text").is_enabled()  # tiny takes arrays only
    assert "takes token embeddings only" in browser.find_element(By.ID, "status").text

    d_model = httpx.get(f"{keyed_tiny}/v1/models/tiny", headers=BEARER).json()
    rng = np.random.default_rng(7)
    sequence = rng.standard_normal((5, d_model["d_model"])).astype(np.float64)  # float64 on disk
    path = tmp_path / "tokens.npy"
    np.save(path, sequence)
    browser.find_element(By.ID, "npy").send_keys(str(path))
    wait_for_script(browser, RENDERED)
    assert labels(browser, "queries") == [f"#{i}" for i in range(5)]
    canvas = browser.find_element(By.ID, "heatmap")
    inputs = [sequence.astype(np.float32).tolist()]
    mean = {"layers": [1], "reduce": "mean"}
    want = api_attention(keyed_tiny, inputs, mean, "tiny", headers=BEARER)[0, 0]
    assert abs(float(hover_cell(browser, canvas, 4, 2)["weight"]) - want[4, 2]) <= WEIGHT_TOLERANCE
    # An uploaded file cannot be linked: the URL keeps the view but no text.
    assert "text" not in url_params(browser) and url_params(browser)["view"] == "mean"
    (body,) = posted_bodies(browser, "/v1/encode")
    assert body["inputs"][0]["shape"] == [5, d_model["d_model"]]
    screenshot(browser, "viewer-npy")
    assert_only_local_requests(browser, keyed_tiny)


def test_npy_files_are_read_in_any_byte_order_and_bad_ones_explained(
    browser: webdriver.Chrome, server_url: str, tmp_path: Path
) -> None:
    browser.get(f"{server_url}/viewer?model=tiny&layer=0&head=1&view=head")
    wait_for_script(browser, "document.getElementById('model').options.length > 0")
    d_model = httpx.get(f"{server_url}/v1/models/tiny").json()["d_model"]
    upload = browser.find_element(By.ID, "npy")

    cube = tmp_path / "batch.npy"
    np.save(cube, np.zeros((2, 3, d_model), dtype=np.float32))
    upload.send_keys(str(cube))
    wait_for_script(browser, "document.getElementById('status').textContent.includes('batch.npy')")
    assert "expected [n, d_model]" in browser.find_element(By.ID, "status").text
    narrow = tmp_path / "narrow.npy"
    np.save(narrow, np.zeros((3, d_model + 1), dtype=np.float32))
    upload.send_keys(str(narrow))
    wait_for_script(browser, "document.getElementById('status').textContent.includes('narrow.npy')")
    assert f"does not match tiny's d_model {d_model}" in browser.find_element(By.ID, "status").text

    sequence = np.random.default_rng(3).standard_normal((4, d_model)).astype(">f4")
    big_endian = tmp_path / "big.npy"
    np.save(big_endian, sequence)
    upload.send_keys(str(big_endian))
    wait_for_script(browser, RENDERED)
    canvas = browser.find_element(By.ID, "heatmap")
    inputs = [sequence.astype("<f4").tolist()]
    want = api_attention(server_url, inputs, {"layers": [0], "heads": [1]}, "tiny")[0, 0]
    assert abs(float(hover_cell(browser, canvas, 3, 0)["weight"]) - want[3, 0]) <= WEIGHT_TOLERANCE
    assert_only_local_requests(browser, server_url)


@pytest.fixture(scope="module")
def rerankers(head_models: tuple[Path, dict[str, Path]]) -> Iterator[str]:
    with running_server(head_models[0]) as url:
        yield url


def test_why_it_ranked_draws_the_query_to_document_attention(
    browser: webdriver.Chrome, rerankers: str
) -> None:
    """A reranker's query and document side by side: the lines drawn are the strongest
    pairs of the chosen head's query-to-document attention, as /v1/rerank answers it,
    and the list beside them is its most attended document tokens."""
    document, query = "attention weighs every token by its relevance", "what is attention"
    open_view(browser, rerankers, text=document, model="bert-reranker", layer="1", head="2")
    assert browser.find_element(By.ID, "show-rank").is_displayed()
    field = browser.find_element(By.ID, "query")
    field.clear()
    field.send_keys(query)
    browser.find_element(By.ID, "show-rank").click()
    wait_for_script(browser, "document.querySelectorAll('#rank line.pair').length > 0")
    wait_for_script(browser, RENDERED)
    body = {
        "model": "bert-reranker",
        "query": query,
        "documents": [document],
        "return_attention": True,
        "attention": {"layers": [1], "heads": [2], "reduce": "none"},
        "top_tokens": 8,
    }
    answer = httpx.post(f"{rerankers}/v1/rerank", json=body, timeout=60).json()["results"][0]
    block = np.asarray(answer["explanation"]["attention"], dtype=np.float32)[0, 0]  # (q, d)
    lines = browser.execute_script(
        "return [...document.querySelectorAll('#rank line.pair')].map(l => "
        "[Number(l.dataset.query), Number(l.dataset.document), Number(l.dataset.weight)])"
    )
    q, d = block.shape
    assert len(lines) == min(60, q * d)
    order = sorted(((i, j) for i in range(q) for j in range(d)), key=lambda p: -block[p])
    assert [(i, j) for i, j, _ in lines[:5]] == order[:5]
    for i, j, weight in lines:
        assert abs(weight - block[i, j]) <= WEIGHT_TOLERANCE
    listed = browser.find_elements(By.CSS_SELECTOR, "#rank-top li")
    shown = [e.get_attribute("data-index") for e in listed]
    assert shown == [str(t["index"]) for t in answer["explanation"]["top_tokens"]]
    score = float(browser.find_element(By.ID, "rank-score").get_attribute("data-score") or "nan")
    assert abs(score - answer["relevance_score"]) <= 1e-9
    tokens = browser.execute_script(
        "return [...document.querySelectorAll('#rank text.dtok')].map(t => t.textContent)"
    )
    assert tokens == answer["explanation"]["document_tokens"]
    screenshot(browser, "viewer-why-it-ranked")
    assert_only_local_requests(browser, rerankers)


def api_item(url: str, inputs: list, attention: dict, model: str) -> dict:
    """One item of /v1/encode's answer (JSON floats) for ``attention``."""
    body = {
        "model": model,
        "inputs": inputs,
        "return_embeddings": False,
        "return_attention": True,
        "attention": attention,
        "truncate": True,
    }
    answer = httpx.post(f"{url}/v1/encode", json=body, timeout=60)
    answer.raise_for_status()
    item: dict = answer.json()["data"][0]
    return item


def summary_cells(driver: webdriver.Chrome) -> list[list[float]]:
    """The summaries grid as the page shows it: [layer][head] of each cell's value."""
    cells = driver.execute_script(
        "return [...document.querySelectorAll('#summaries .sum')].map(b => "
        "[Number(b.dataset.layer), Number(b.dataset.head), Number(b.dataset.value)])"
    )
    layers, heads = max(c[0] for c in cells) + 1, max(c[1] for c in cells) + 1
    grid = [[float("nan")] * heads for _ in range(layers)]
    for layer, head, value in cells:
        grid[layer][head] = value
    return grid


def test_the_summaries_grid_is_the_way_in_and_a_click_opens_that_head(
    browser: webdriver.Chrome, minilm: str
) -> None:
    """With no view named the page opens on every layer's and head's summaries (no maps
    asked for); the chosen summary colours the grid without a new request; a click on a
    cell shows that layer's head, a short text's whole map."""
    open_view(browser, minilm, text=TEXT, model="minilm-l6")
    assert url_params(browser)["view"] == "summaries"
    (body,) = posted_bodies(browser, "/v1/encode")
    assert body["attention"] == {"summaries": SUMMARIES, "maps": False}
    want = api_item(minilm, [TEXT], {"summaries": SUMMARIES, "maps": False}, "minilm-l6")
    assert want["attention"] is None
    shown = np.asarray(summary_cells(browser))
    assert shown.shape == (6, 12)
    entropy = np.asarray(want["attention_summaries"]["entropy"])
    assert np.abs(shown - entropy).max() <= WEIGHT_TOLERANCE
    screenshot(browser, "viewer-summaries")

    Select(browser.find_element(By.ID, "summary")).select_by_value("distance")
    wait_for_script(browser, "document.getElementById('summaries').dataset.summary === 'distance'")
    distance = np.asarray(want["attention_summaries"]["distance"])
    assert np.abs(np.asarray(summary_cells(browser)) - distance).max() <= WEIGHT_TOLERANCE
    assert url_params(browser)["summary"] == "distance"
    assert len(posted_bodies(browser, "/v1/encode")) == 1  # the grid had every summary

    browser.find_element(By.CSS_SELECTOR, '#summaries .sum[data-layer="3"][data-head="5"]').click()
    wait_for_script(browser, "document.getElementById('stage').dataset.view === 'head'")
    wait_for_script(browser, RENDERED)
    assert {k: url_params(browser)[k] for k in ("layer", "head", "view")} == {
        "layer": "3",
        "head": "5",
        "view": "head",
    }
    canvas = browser.find_element(By.ID, "heatmap")
    assert canvas.get_attribute("data-n") == str(len(TOKENS))
    assert canvas.get_attribute("data-topk") == ""  # a short text: the whole map
    asked = posted_bodies(browser, "/v1/encode")[-1]["attention"]
    assert asked == {"layers": [3], "heads": [5], "reduce": "none"}
    map_ = api_attention(minilm, [TEXT], {"layers": [3], "heads": [5]}, "minilm-l6")[0, 0]
    assert abs(float(hover_cell(browser, canvas, 4, 1)["weight"]) - map_[4, 1]) <= WEIGHT_TOLERANCE
    assert_only_local_requests(browser, minilm)


LONG_TOKENS = 512


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A small random encoder that reads 512 tokens (MiniLM's WordPiece tokenizer, mean
    pooling): a long input for the page without a base-size model's minutes per export."""
    config = preset("tiny", max_seq_len=LONG_TOKENS)
    root = tmp_path_factory.mktemp("long-models")
    export_model(
        Encoder(config, seed=11),
        root / "long",
        exporter="torchscript",
        optimize=False,
        embeddings=TokenEmbeddings(30522, LONG_TOKENS, 2, config.d_model, 1e-12),
        tokenizer_file=minilm_l6_dir() / "tokenizer.json",
        name="long",
        seed=11,
        pooling="mean",
    )
    with running_server(root) as url:
        yield url


def painted_columns(driver: webdriver.Chrome, row: int) -> list[int]:
    """The key columns of query ``row`` the heatmap paints (not the page's empty colour)."""
    return driver.execute_script(  # type: ignore[no-any-return]
        """
        const canvas = document.getElementById('heatmap');
        const cell = Number(canvas.dataset.cell), n = Number(canvas.dataset.n);
        const y = Math.floor(arguments[0] * cell + cell / 2);
        const strip = canvas.getContext('2d').getImageData(0, y, n * cell, 1).data;
        const painted = [];
        for (let j = 0; j < n; j++) {
          const p = Math.floor(j * cell + cell / 2) * 4;
          if (!(strip[p] === 246 && strip[p + 1] === 246 && strip[p + 2] === 248)) painted.push(j);
        }
        return painted;
        """,
        row,
    )


def hover_far_cell(driver: webdriver.Chrome, i: int, j: int) -> dict[str, str]:
    """``hover_cell`` for a map larger than the window: the map scrolled so cell (i, j) is
    in view, the real mouse moved to it in the window's coordinates."""
    x, y = driver.execute_script(
        """
        const [i, j] = arguments, canvas = document.getElementById('heatmap');
        const cell = Number(canvas.dataset.cell), scroller = document.querySelector('.scroller');
        scroller.scrollLeft = Math.max(0, j * cell - 200);
        scroller.scrollTop = Math.max(0, i * cell - 200);
        scroller.scrollIntoView({block: 'start'});
        const box = canvas.getBoundingClientRect();
        return [box.left + (j + 0.5) * cell, box.top + (i + 0.5) * cell];
        """,
        i,
        j,
    )
    actions = ActionBuilder(driver)
    actions.pointer_action.move_to_location(int(x), int(y))
    actions.perform()
    wait_for_script(
        driver,
        f"document.getElementById('readout').dataset.query === '{i}' && "
        f"document.getElementById('readout').dataset.key === '{j}'",
    )
    readout = driver.find_element(By.ID, "readout")
    return {k: readout.get_attribute(f"data-{k}") or "" for k in ("query", "key", "weight")}


def test_a_512_token_input_draws_its_top_k_keys_as_a_sparse_map_that_zooms(
    browser: webdriver.Chrome, long_model: str
) -> None:
    """512 tokens: the summaries grid first, then one head's map with each row's top 32
    keys only (auto), those cells painted and no others; zoomed out to fit, the labels
    are thinned."""
    text = " ".join(f"word{i}" for i in range(400))  # more word pieces than 512: cut
    open_view(browser, long_model, text=text, model="long")
    assert np.asarray(summary_cells(browser)).shape == (2, 4)
    browser.find_element(By.CSS_SELECTOR, '#summaries .sum[data-layer="1"][data-head="2"]').click()
    wait_for_script(browser, "document.getElementById('stage').dataset.view === 'head'")
    wait_for_script(browser, RENDERED)
    asked = posted_bodies(browser, "/v1/encode")[-1]["attention"]
    assert asked == {"layers": [1], "heads": [2], "reduce": "none", "top_k": 32}
    canvas = browser.find_element(By.ID, "heatmap")
    assert canvas.get_attribute("data-n") == str(LONG_TOKENS)
    assert canvas.get_attribute("data-topk") == "32"
    assert "top 32 keys" in browser.find_element(By.ID, "status").text
    assert canvas.get_attribute("data-cell") == "4"  # two screens wide, every third label
    assert labels(browser, "queries")[:4] == ["[CLS]", "", "", "word"]

    want = api_item(long_model, [text], asked, "long")
    indices = np.asarray(want["attention_indices"])[0, 0]  # [n, k]
    weights = np.asarray(want["attention"], dtype=np.float32)[0, 0]
    assert indices.shape == (LONG_TOKENS, 32)
    for row in (0, 1, 300, LONG_TOKENS - 1):
        assert painted_columns(browser, row) == sorted(indices[row].tolist())
    kept = int(indices[300, 0])  # row 300's strongest key
    read = hover_far_cell(browser, 300, kept)
    assert abs(float(read["weight"]) - weights[300, 0]) <= WEIGHT_TOLERANCE
    dropped = next(j for j in range(400, LONG_TOKENS) if j not in set(indices[450].tolist()))
    assert hover_far_cell(browser, 450, dropped)["weight"] == ""
    assert "not among the row's top 32" in browser.find_element(By.ID, "readout").text
    # Scrolled far to the right, the query labels stay at the frame's left edge.
    stuck = browser.execute_script(
        "const s = document.querySelector('.scroller'); return [s.scrollLeft, "
        "document.querySelector('.queries').getBoundingClientRect().left - "
        "s.getBoundingClientRect().left]"
    )
    assert stuck[0] > 1000 and abs(stuck[1]) <= 2
    screenshot(browser, "viewer-512-top-k")

    browser.find_element(By.ID, "zoom-fit").click()
    wait_for_script(browser, "Number(document.getElementById('heatmap').dataset.cell) <= 2")
    canvas = browser.find_element(By.ID, "heatmap")
    cell = int(canvas.get_attribute("data-cell") or 0)
    assert canvas.get_property("width") == LONG_TOKENS * cell
    written = [t for t in labels(browser, "queries") if t]
    assert len(labels(browser, "queries")) == LONG_TOKENS
    assert 0 < len(written) <= LONG_TOKENS // 4  # every few labels, not a smear of 512
    scrolls = "const s = document.querySelector('.scroller'); return s.scrollWidth > s.clientWidth"
    assert not browser.execute_script(scrolls)  # the whole map in view
    assert painted_columns(browser, 300) == sorted(indices[300].tolist())
    # Ctrl + wheel over the map zooms in a step (a plain wheel only scrolls).
    browser.execute_script(
        "arguments[0].dispatchEvent(new WheelEvent('wheel', {deltaY: -100, ctrlKey: true, "
        "bubbles: true, cancelable: true, clientX: 300, clientY: 400}))",
        canvas,
    )
    wait_for_script(browser, f"Number(document.getElementById('heatmap').dataset.cell) > {cell}")
    screenshot(browser, "viewer-512-fit")
    assert_only_local_requests(browser, long_model)


def test_why_they_match_draws_the_top_token_pairs_and_the_score(
    browser: webdriver.Chrome, minilm: str
) -> None:
    """Two texts: the score is the cosine of the two mean-pooled embeddings, the lines the
    top pairs /v1/explain/similarity names, each token shaded by its total."""
    first, second = "A man is playing a guitar.", "Someone plays an instrument on stage."
    open_view(browser, minilm, text=first, model="minilm-l6", view="head")
    assert browser.find_element(By.ID, "show-match").is_displayed()
    field = browser.find_element(By.ID, "other")
    field.clear()
    field.send_keys(second)
    browser.find_element(By.ID, "show-match").click()
    wait_for_script(browser, "document.getElementById('stage').dataset.view === 'match'")
    wait_for_script(browser, RENDERED)
    (posted,) = posted_bodies(browser, "/v1/explain/similarity")
    assert posted == {
        "model": "minilm-l6",
        "query": first,
        "documents": [second],
        "top_pairs": 20,
        "truncate": True,
    }
    answer = httpx.post(f"{minilm}/v1/explain/similarity", json=posted, timeout=60)
    (result,) = answer.json()["data"]
    score = float(browser.find_element(By.ID, "match-score").get_attribute("data-score") or "nan")
    assert score == result["score"]
    assert f"{score:.4f}" in browser.find_element(By.ID, "match-score").text
    # The score drawn is the served cosine: the two texts' mean-pooled, normalised vectors.
    body = {"model": "minilm-l6", "inputs": [first, second], "pooling": "mean", "normalize": True}
    pooled = httpx.post(f"{minilm}/v1/encode", json=body, timeout=60).json()["data"]
    a, b = (np.asarray(item["pooled"]) for item in pooled)
    assert abs(score - float(a @ b)) <= 1e-5

    lines = browser.execute_script(
        "return [...document.querySelectorAll('#match line.pair')].map(l => "
        "[Number(l.dataset.query), Number(l.dataset.document), Number(l.dataset.contribution)])"
    )
    pairs = result["top_pairs"]
    assert len(pairs) == 20
    drawn = sorted(lines, key=lambda line: -line[2])  # drawn weakest first: strongest on top
    assert [(q, d) for q, d, _ in drawn] == [(p["query_index"], p["document_index"]) for p in pairs]
    widths = browser.execute_script(
        "return [...document.querySelectorAll('#match line.pair')].map(l => "
        "Number(l.getAttribute('stroke-width')))"
    )
    assert widths[-1] == max(widths) > widths[0]  # the largest pair drawn thickest
    for side, tokens, totals in (
        ("qtok", result["query_tokens"], result["query_totals"]),
        ("dtok", result["document_tokens"], result["document_totals"]),
    ):
        read = browser.execute_script(
            f"return [...document.querySelectorAll('#match text.{side}')].map(t => "
            "[t.textContent, Number(t.dataset.total)])"
        )
        assert [t for t, _ in read] == tokens
        assert [v for _, v in read] == totals
    assert abs(sum(result["query_totals"]) - score) <= 1e-5
    screenshot(browser, "viewer-why-they-match")
    assert_only_local_requests(browser, minilm)


def test_the_match_view_checks_no_attention_view_and_each_leads_back(
    browser: webdriver.Chrome, minilm: str
) -> None:
    """ "Why they match" is none of the View radios' maps: before, "head summaries" stayed
    checked beside the match drawing, and a click on it did nothing (no change event)."""
    open_view(browser, minilm, text="A man is playing a guitar.", model="minilm-l6")
    checked = "[...document.querySelectorAll('input[name=view]')].filter(r => r.checked)"
    assert browser.execute_script(f"return {checked}.map(r => r.value)") == ["summaries"]
    browser.find_element(By.ID, "show-match").click()
    wait_for_script(browser, "document.getElementById('stage').dataset.view === 'match'")
    wait_for_script(browser, RENDERED)
    assert browser.execute_script(f"return {checked}.length") == 0
    browser.find_element(By.CSS_SELECTOR, "input[name=view][value=summaries]").click()
    wait_for_script(browser, "document.getElementById('stage').dataset.view === 'summaries'")
    wait_for_script(browser, RENDERED)
    assert browser.execute_script(f"return {checked}.map(r => r.value)") == ["summaries"]
    assert url_params(browser)["view"] == "summaries"


@pytest.fixture(scope="module")
def multi_vector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server on a tiny sentence-transformers MultiVectorEncoder (random weights)."""
    from model_export.cli import main
    from tests.support.late_interaction import LAYOUTS

    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        folder = LAYOUTS["multi_vector_encoder"](tmp_path_factory.mktemp("mve-checkpoint"))
    repository = tmp_path_factory.mktemp("mve-models")
    out = str(repository / "multi-vector-encoder")
    assert main(["--checkpoint", str(folder), "--out", out, "--no-compact-attention"]) == 0
    with running_server(repository) as url:
        yield url


def test_why_it_ranked_on_a_multi_vector_model_draws_the_maxsim_split(
    browser: webdriver.Chrome, multi_vector: str
) -> None:
    """On a late-interaction model "Why it ranked" draws /v1/rerank's MaxSim explanation:
    a line from each query token to its best document token with that match's term, and
    the score, the sum of the terms."""
    document, query = "attention weighs every token by its relevance", "what is attention"
    (card,) = httpx.get(f"{multi_vector}/v1/models", timeout=60).json()["data"]
    assert card["late_interaction"] is True
    open_view(browser, multi_vector, text=document, model="multi-vector-encoder")
    assert browser.find_element(By.ID, "show-rank").is_displayed()
    field = browser.find_element(By.ID, "query")
    field.clear()
    field.send_keys(query)
    browser.find_element(By.ID, "show-rank").click()
    wait_for_script(browser, "document.getElementById('stage').dataset.view === 'maxsim'")
    wait_for_script(browser, RENDERED)
    (posted,) = posted_bodies(browser, "/v1/rerank")
    assert posted == {
        "model": "multi-vector-encoder",
        "query": query,
        "documents": [document],
        "return_attention": True,
        "truncate": True,
    }
    answer = httpx.post(f"{multi_vector}/v1/rerank", json=posted, timeout=60)
    assert answer.status_code == 200, answer.text
    (result,) = answer.json()["results"]
    explanation = result["explanation"]
    matches = explanation["matches"]
    assert len(matches) == len(explanation["query_tokens"]) > 1
    lines = browser.execute_script(
        "return [...document.querySelectorAll('#maxsim line.match')].map(l => "
        "[Number(l.dataset.query), Number(l.dataset.document), Number(l.dataset.term), "
        "Number(l.dataset.share)])"
    )
    drawn = sorted(lines, key=lambda line: line[0])
    assert [(q, d, t) for q, d, t, _ in drawn] == [
        (m["query_index"], m["document_index"], m["score"]) for m in matches
    ]
    score = result["relevance_score"]
    for _, _, term, share in drawn:
        assert abs(share - term / score) <= 1e-12
    for side, tokens in (
        ("qtok", explanation["query_tokens"]),
        ("dtok", explanation["document_tokens"]),
    ):
        read = browser.execute_script(
            f"return [...document.querySelectorAll('#maxsim text.{side}')].map(t => t.textContent)"
        )
        assert read == tokens
    shown = browser.find_element(By.ID, "maxsim-score")
    assert float(shown.get_attribute("data-score") or "nan") == score
    assert abs(float(shown.get_attribute("data-sum") or "nan") - score) <= 1e-9
    assert f"{score:.4f}" in shown.text
    listed = browser.find_elements(By.CSS_SELECTOR, "#maxsim-matches li")
    assert len(listed) == len(matches)
    screenshot(browser, "viewer-why-it-ranked-maxsim")
    assert_only_local_requests(browser, multi_vector)
