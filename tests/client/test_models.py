"""``models()``, ``model(name)``, ``ready()`` and ``wait_until_ready()`` on real servers."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from attnserve_client import APITimeoutError, AsyncClient, Client, ModelCard
from model_export import graph_io
from tests.support.tiny import D_MODEL, MODEL, MODEL_MAX_SEQ_LEN, N_HEADS, N_LAYERS

WAIT = 0.5  # seconds wait_until_ready is given where it must give up
GIVE_UP_WITHIN = 3.0  # ... and the most it may take to do so


def assert_tiny_card(card: ModelCard, tiny_model_dir: Path) -> None:
    assert (card.name, card.d_model, card.heads, card.layers) == (
        MODEL,
        D_MODEL,
        N_HEADS,
        N_LAYERS,
    )
    assert card.max_seq_len == MODEL_MAX_SEQ_LEN
    assert card.dimensions == D_MODEL  # no Dense layer: the pooled width is d_model
    assert card.tokenizer is False and card.default is True
    config = json.loads((tiny_model_dir / graph_io.CONFIG_FILE).read_text())
    assert card.raw["d_ff"] == config["architecture"]["d_ff"]
    # Every file the server checked: the graphs and the weight file they share.
    assert card.raw["sha256"] == {
        **{g: config["graphs"][g]["sha256"] for g in graph_io.GRAPH_OUTPUTS},
        graph_io.WEIGHTS_FILE: config["weights_sha256"],
    }


def test_models_and_model(sdk_client: Client, tiny_model_dir: Path) -> None:
    cards = sdk_client.models()
    assert [c.name for c in cards] == [MODEL]
    assert_tiny_card(cards[0], tiny_model_dir)
    card = sdk_client.model(MODEL)
    assert_tiny_card(card, tiny_model_dir)
    assert card == cards[0]


def test_async_models_and_model(server_url: str, tiny_model_dir: Path) -> None:
    async def run() -> tuple[list[ModelCard], ModelCard]:
        async with AsyncClient(server_url) as client:
            return await client.models(), await client.model(MODEL)

    cards, card = asyncio.run(run())
    assert len(cards) == 1
    assert_tiny_card(cards[0], tiny_model_dir)
    assert card == cards[0]


def test_ready_server(sdk_client: Client) -> None:
    assert sdk_client.ready() is True
    start = time.monotonic()
    sdk_client.wait_until_ready(timeout=10.0)
    assert time.monotonic() - start < 1.0  # ready at once: no polling interval spent


def test_async_ready_server(server_url: str) -> None:
    async def run() -> bool:
        async with AsyncClient(server_url) as client:
            await client.wait_until_ready(timeout=10.0)
            return await client.ready()

    assert asyncio.run(run()) is True


@pytest.mark.parametrize("which", ["nothing listening", "live, not ready"])
def test_wait_until_ready_gives_up(which: str, closed_port_url: str, not_ready_url: str) -> None:
    url = closed_port_url if which == "nothing listening" else not_ready_url
    with Client(url) as client:
        assert client.ready() is False
        start = time.monotonic()
        with pytest.raises(APITimeoutError, match="not ready"):
            client.wait_until_ready(timeout=WAIT, interval=0.05)
        elapsed = time.monotonic() - start
    assert WAIT <= elapsed < GIVE_UP_WITHIN


def test_async_wait_until_ready_gives_up(closed_port_url: str) -> None:
    async def run() -> bool:
        async with AsyncClient(closed_port_url) as client:
            ready = await client.ready()
            await client.wait_until_ready(timeout=WAIT, interval=0.05)
            return ready

    start = time.monotonic()
    with pytest.raises(APITimeoutError, match="not ready"):
        asyncio.run(run())
    assert WAIT <= time.monotonic() - start < GIVE_UP_WITHIN
