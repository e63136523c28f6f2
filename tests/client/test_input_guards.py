"""Arguments that must not reach the wire as something else."""

from __future__ import annotations

import pytest

from attnserve_client import Client, NotFoundError


def test_model_names_are_quoted_into_the_path(server_url: str) -> None:
    with Client(server_url, max_retries=0) as client:
        assert client.model("tiny").name == "tiny"
        with pytest.raises(NotFoundError) as info:
            client.model("tiny?x=1")  # unquoted, this would be the card of "tiny"
    assert info.value.error_type == "model_not_found"


def test_a_non_ascii_api_key_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="ASCII"):
        Client("http://127.0.0.1:9", api_key="s\u00e9kret")
