"""``plot_attention`` writes a PNG of the size plot.py sets: a square-ish figure of
``max(4, min(16, 0.35 n + 2))`` by 0.9 times that inches, saved at dpi 100."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from attnserve_client import Client, EncodeResult, plot_attention
from tests.support.inputs import sequences

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def close_figures() -> Iterator[None]:
    yield
    import matplotlib.pyplot as plt  # after plot_attention has chosen its backend

    plt.close("all")


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which must come first after the signature."""
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize(
    ("n", "size_px"),
    [
        (5, (400, 360)),  # 0.35 * 5 + 2 = 3.75 in, raised to the 4 in minimum
        (30, (1250, 1125)),  # 0.35 * 30 + 2 = 12.5 in
        (60, (1600, 1440)),  # 23 in, capped at 16 in
    ],
)
def test_png_has_the_figure_size(
    sdk_client: Client, tmp_path: Path, n: int, size_px: tuple[int, int]
) -> None:
    result = sdk_client.encode(sequences((n,), seed=n), return_attention=True)
    path = tmp_path / "attention.png"
    fig = plot_attention(result, layer=-1, path=path)
    data = path.read_bytes()
    assert png_size(data) == size_px
    pixels = matplotlib.image.imread(path)  # (height, width, RGBA)
    assert pixels.shape[:2] == (size_px[1], size_px[0])
    assert np.ptp(pixels[..., :3]) > 0.5  # a heatmap, not a blank canvas
    assert fig.axes[0].get_title().startswith(f"{result.model}: sequence 0, layer -1")


def test_one_head_and_labels(sdk_client: Client, tmp_path: Path) -> None:
    result = sdk_client.encode(sequences((2, 4), seed=1), return_attention=True)
    labels = ["a", "b", "c", "d"]
    path = tmp_path / "head.png"
    fig = plot_attention(result, index=1, layer=0, head=2, tokens=labels, path=path)
    assert png_size(path.read_bytes()) == (400, 360)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == labels
    assert "head 2" in ax.get_title()
    # The image shows that head's map itself.
    assert result.attention is not None
    shown = ax.images[0].get_array()
    np.testing.assert_array_equal(np.asarray(shown), result.attention[1][0, 2])  # atol 0


def test_no_file_without_path(sdk_client: Client, tmp_path: Path) -> None:
    result = sdk_client.encode(sequences((3,), seed=2), return_attention=True, reduce="rollout")
    fig = plot_attention(result)
    assert fig.axes and not list(tmp_path.iterdir())


def test_refusals(sdk_client: Client) -> None:
    without: EncodeResult = sdk_client.encode(sequences((3,), seed=3))
    with pytest.raises(ValueError, match="return_attention"):
        plot_attention(without)
    with_attention = sdk_client.encode(sequences((3,), seed=3), return_attention=True)
    with pytest.raises(ValueError, match="2 token labels for a 3x3"):
        plot_attention(with_attention, tokens=["a", "b"])
