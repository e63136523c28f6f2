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
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement

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
