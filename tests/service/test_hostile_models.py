"""A model directory is untrusted input: hostile ones, made by copying the tiny export and
editing its config.json, loaded into a real server through the repository API.

Each must be refused with a clear 4xx that names the model and never a file beyond
the repository, its digest, or the repository's own path; the server keeps serving.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import onnx
import pytest
import tritonclient.grpc as tgrpc
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from tritonclient.utils import InferenceServerException

from model_export import graph_io
from model_export.config import EncoderConfig
from model_export.export import export_model
from model_export.manifest import MAX_CONFIG_BYTES, sha256_file
from model_export.model import Encoder, TokenEmbeddings
from service.errors import ModelLoadError
from service.model_info import read_model_info
from service.settings import Settings
from service.tokenizer import PROBE_TEXT, TextFrontEnd
from tests.conftest import ServerFailed, ServerProcess, free_port, server_process
from tests.support.wait import wait_until

OUTSIDE = Path("/etc/hostname")  # a readable file beyond any repository


def copy_as(tiny: Path, target: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A copy of the tiny export named after ``target``'s directory, config.json edited."""
    shutil.copytree(tiny, target)
    config = target / graph_io.CONFIG_FILE
    raw = json.loads(config.read_text())
    raw["name"] = target.name
    if edit is not None:
        edit(raw)
    config.write_text(json.dumps(raw))
    return target


def text_section(**files: str) -> Callable[[dict[str, Any]], None]:
    """An edit giving the model a text front end whose files are ``files``."""

    def edit(raw: dict[str, Any]) -> None:
        raw["text"] = {
            "embeddings_graph": "embeddings.onnx",
            "embeddings_sha256": "0" * 64,
            "vocab_size": 100,
            "type_vocab_size": 2,
            "max_positions": 128,
            **files,
        }

    return edit


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The root holding ``repo/`` (tiny and the hostile directories) and ``outside/``."""
    root = tmp_path_factory.mktemp("hostile")
    repo = root / "repo"
    shutil.copytree(tiny_model_dir, repo / "tiny")
    outside = root / "outside"
    outside.mkdir()
    # The exploit: a graph whose digest matches, read from beyond the repository.
    copy_as(tiny_model_dir, outside / "linked-dir")
    shutil.copy(tiny_model_dir / graph_io.GRAPH_ATTENTION, outside / graph_io.GRAPH_ATTENTION)
    linked_file = copy_as(tiny_model_dir, repo / "linked-file")
    (linked_file / graph_io.GRAPH_ATTENTION).unlink()
    (linked_file / graph_io.GRAPH_ATTENTION).symlink_to(outside / graph_io.GRAPH_ATTENTION)
    (repo / "linked-dir").symlink_to(outside / "linked-dir")
    # Inside the repository, a link is fine.
    linked_inside = copy_as(tiny_model_dir, repo / "linked-inside")
    (linked_inside / graph_io.GRAPH_ATTENTION).unlink()
    (linked_inside / graph_io.GRAPH_ATTENTION).symlink_to(repo / "tiny" / graph_io.GRAPH_ATTENTION)
    digest = "1" * 64  # wrong: the old error printed the file's real digest (a hash oracle)
    copy_as(
        tiny_model_dir,
        repo / "absolute",
        text_section(embeddings_graph=str(OUTSIDE), embeddings_sha256=digest),
    )
    copy_as(
        tiny_model_dir,
        repo / "dotdot",
        text_section(stopwords="../../outside/words.txt", stopwords_sha256=digest),
    )
    # Sizes that cost gigabytes before anything checked them.
    copy_as(tiny_model_dir, repo / "wide", architecture(d_model=1 << 26))
    copy_as(tiny_model_dir, repo / "deep", architecture(d_model=4096, n_layers=1000, d_ff=4096))
    copy_as(tiny_model_dir, repo / "lying", architecture(d_model=64))  # the graphs are 32 wide
    copy_as(tiny_model_dir, repo / "huge", lambda raw: raw.update(pad="x" * MAX_CONFIG_BYTES))
    garbage = copy_as(tiny_model_dir, repo / "garbage")  # hashes match, onnxruntime refuses it
    (garbage / graph_io.GRAPH_ATTENTION).write_bytes(b"not an onnx graph")
    raw = json.loads((garbage / graph_io.CONFIG_FILE).read_text())
    raw["graphs"][graph_io.GRAPH_ATTENTION]["sha256"] = sha256_file(
        garbage / graph_io.GRAPH_ATTENTION
    )
    (garbage / graph_io.CONFIG_FILE).write_text(json.dumps(raw))
    # The shared weight file: a graph that reads its weights from beyond its directory
    # (its digest recorded, so only onnxruntime's own check stands in the way), and a
    # weight file that does not match its digest.
    shutil.copy(tiny_model_dir / graph_io.WEIGHTS_FILE, outside / graph_io.WEIGHTS_FILE)
    escaping = copy_as(tiny_model_dir, repo / "weights-outside")
    read_weights_from(escaping, graph_io.GRAPH_EMBEDDINGS, f"../../outside/{graph_io.WEIGHTS_FILE}")
    corrupt = copy_as(tiny_model_dir, repo / "weights-corrupt")
    with (corrupt / graph_io.WEIGHTS_FILE).open("r+b") as weights:
        first = weights.read(1)
        weights.seek(0)
        weights.write(bytes([first[0] ^ 1]))
    nested = copy_as(tiny_model_dir, repo / "nested")
    config = nested / graph_io.CONFIG_FILE
    deep = "[" * 100_000 + "]" * 100_000  # json's parser gave up with RecursionError
    config.write_text(config.read_text()[:-1] + f', "deep": {deep}}}')
    return root


def read_weights_from(model_dir: Path, graph: str, location: str) -> None:
    """Point every external tensor of ``graph`` at ``location``; record its new digest."""
    model = onnx.load(str(model_dir / graph), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(model, str(model_dir / graph))
    raw = json.loads((model_dir / graph_io.CONFIG_FILE).read_text())
    raw["graphs"][graph]["sha256"] = sha256_file(model_dir / graph)
    (model_dir / graph_io.CONFIG_FILE).write_text(json.dumps(raw))


def architecture(**sizes: int) -> Callable[[dict[str, Any]], None]:
    return lambda raw: raw["architecture"].update(sizes)


GRPC: dict[str, str] = {}


@pytest.fixture(scope="module")
def server(hostile: Path) -> Iterator[ServerProcess]:
    port = free_port()
    with server_process(
        hostile / "repo", model_control="explicit", default_model="tiny", grpc_port=str(port)
    ) as s:
        GRPC["address"] = f"127.0.0.1:{port}"
        yield s


def load(server: ServerProcess, name: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/repository/models/{name}/load", timeout=60)


def assert_refused_cleanly(answer: httpx.Response, hostile: Path, says: str) -> None:
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert says in message, message
    assert str(hostile) not in message and str(OUTSIDE) not in message.replace("'", ""), message


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("absolute", "text.embeddings_graph must be a plain file name"),
        ("dotdot", "text.stopwords must be a plain file name"),
        ("linked-file", "model_attn.onnx resolves outside the model repository"),
        ("linked-dir", "config.json resolves outside the model repository"),
    ],
)
def test_files_beyond_the_model_directory_are_refused(
    server: ServerProcess, hostile: Path, name: str, says: str
) -> None:
    answer = load(server, name)
    if name == "absolute":  # the manifest's own words may be quoted, nothing read from it
        assert hashlib.sha256(OUTSIDE.read_bytes()).hexdigest() not in answer.text
        assert answer.status_code == 400 and says in answer.text, answer.text
    else:
        assert_refused_cleanly(answer, hostile, says)
    assert f"{name!r} was not loaded" in answer.json()["error"]
    assert httpx.get(f"{server.url}/v2/models/{name}/ready").status_code == 404
    assert httpx.get(f"{server.url}/health/ready").status_code == 200


def test_a_link_inside_the_repository_is_followed(server: ServerProcess) -> None:
    answer = load(server, "linked-inside")
    assert answer.status_code == 200, answer.text
    assert httpx.get(f"{server.url}/v2/models/linked-inside/ready").status_code == 200


def test_follow_symlinks_allows_links_out_of_the_repository(hostile: Path) -> None:
    """ATTNSERVE_FOLLOW_SYMLINKS=true: the operator's choice (e.g. a shared weight cache)."""
    with server_process(
        hostile / "repo", model_control="explicit", default_model="tiny", follow_symlinks="true"
    ) as server:
        for name in ("linked-file", "linked-dir"):
            answer = load(server, name)
            assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("wide", "d_model must be an integer in 1..65536, got 67108864"),
        ("deep", "its architecture needs at least"),
        ("lying", "model.onnx's inputs_embeds is 32 wide, but config.json says d_model 64"),
        ("huge", f"config.json is larger than {MAX_CONFIG_BYTES} bytes"),
        ("nested", "config.json nests deeper than 32 levels"),
        ("garbage", "cannot load model_attn.onnx"),  # onnxruntime's message told the path
        ("weights-corrupt", "weights.bin is corrupt"),
        # onnxruntime's refusal, the resolved path (beyond the repository) left out.
        ("weights-outside", "cannot load model.onnx: [ONNXRuntimeError] : 1 : FAIL : External"),
    ],
)
def test_sizes_in_config_json_are_checked_before_anything_is_allocated(
    server: ServerProcess, hostile: Path, name: str, says: str
) -> None:
    answer = load(server, name)
    assert_refused_cleanly(answer, hostile, says)
    assert "warm-up" not in answer.text  # it said so for a config.json it could not parse
    assert httpx.get(f"{server.url}/health/ready").status_code == 200


@pytest.mark.parametrize("name", ["x" * 256, "x" * 5000, ".hidden", "a\\b"])
def test_a_name_no_directory_can_have_is_a_clear_4xx(
    server: ServerProcess, hostile: Path, name: str
) -> None:
    """A 256-byte name was a 500 (File name too long) whose gRPC error told the
    repository's absolute path."""
    for action in ("load", "unload"):
        answer = httpx.post(f"{server.url}/v2/repository/models/{name}/{action}", timeout=30)
        assert answer.status_code == 422, answer.text
        assert "a model name must be a plain file name" in answer.json()["error"]
        assert str(hostile) not in answer.text
    client = tgrpc.InferenceServerClient(GRPC["address"])
    try:
        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as refused:
                call(name)
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", refused.value
            assert str(hostile) not in str(refused.value)
    finally:
        client.close()


def test_the_empty_name_is_not_the_repository(server: ServerProcess) -> None:
    """RepositoryModelLoad("") took the repository's root for a model directory."""
    client = tgrpc.InferenceServerClient(GRPC["address"])
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("")
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", refused.value
        # Refused as a name, not tried as a directory (it was "'' was not loaded: it holds
        # neither an export nor numbered versions", the root read as a model).
        assert "a model name must be a plain file name" in str(refused.value), refused.value
    finally:
        client.close()
    index = httpx.post(f"{server.url}/v2/repository/index", timeout=30).json()
    assert "" not in {entry["name"] for entry in index}


# -- a tokenizer that loads but cannot encode ----------------------------------------------

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
VOCAB_SIZE = 256


def wordpiece(words: list[str], unk: str) -> Tokenizer:
    """A BERT-style WordPiece tokenizer over ``words`` (ids in order) whose unknown-word
    token is ``unk``."""
    vocab = {w: i for i, w in enumerate(dict.fromkeys(SPECIALS + words))}
    assert len(vocab) <= VOCAB_SIZE
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return tokenizer


def with_tokenizer(text_model: Path, target: Path, tokenizer: Tokenizer) -> None:
    """A copy of the text model under ``target``'s name with ``tokenizer``, its digest
    recorded: a directory that keeps the contract."""

    def edit(raw: dict[str, Any]) -> None:
        tokenizer.save(str(target / graph_io.TOKENIZER_FILE))
        raw["text"]["tokenizer_sha256"] = sha256_file(target / graph_io.TOKENIZER_FILE)

    copy_as(text_model, target, edit)


@pytest.fixture(scope="module")
def text_models(hostile: Path, tiny_config: EncoderConfig) -> Path:
    """A tiny model with a text front end (torchscript: a few seconds), and two hostile
    copies: one whose tokenizer lacks its unknown-word token, one whose vocabulary holds
    exactly the load-time probe's words (it passes the probe, then fails on others)."""
    root = hostile / "text-export"
    root.mkdir()
    good = wordpiece(["the", "cat", "sat", "on", "mat", "."], "[UNK]")
    good.save(str(root / "tokenizer.json"))
    d, length = tiny_config.d_model, tiny_config.max_seq_len
    export_model(
        Encoder(tiny_config, seed=5),
        root / "text",
        exporter="torchscript",
        optimize=False,
        embeddings=TokenEmbeddings(VOCAB_SIZE, length, 2, d, 1e-12),
        tokenizer_file=root / "tokenizer.json",
        name="text",
        seed=5,
    )
    repo = hostile / "repo"
    copy_as(root / "text", repo / "text")
    with_tokenizer(root / "text", repo / "no-unk", wordpiece(["the", "cat"], "[MISSING]"))
    normalized = good.normalizer.normalize_str(PROBE_TEXT)  # type: ignore[union-attr]
    probe_words = [w for w, _ in good.pre_tokenizer.pre_tokenize_str(normalized)]  # type: ignore[union-attr]
    fitted = wordpiece([*probe_words, "the", "cat"], "[MISSING]")
    with_tokenizer(root / "text", repo / "probe-fitted", fitted)
    return repo


def test_a_tokenizer_that_cannot_encode_never_becomes_ready(
    server: ServerProcess, text_models: Path
) -> None:
    """Its unknown-word token is not in its vocabulary: every text with an unknown word
    was a 500 once it had loaded; now the load is refused."""
    assert load(server, "text").status_code == 200  # the same model, its tokenizer sound
    answer = load(server, "no-unk")
    assert answer.status_code == 400, answer.text
    assert "tokenizer of model 'no-unk' cannot encode" in answer.json()["error"], answer.text
    assert httpx.get(f"{server.url}/v2/models/no-unk/ready").status_code == 404


def test_a_tokenizer_failing_at_request_time_is_a_4xx(
    server: ServerProcess, text_models: Path
) -> None:
    """One that passes the probe still fails on other words: a 422 naming the model."""
    assert load(server, "probe-fitted").status_code == 200
    for path, body, status in [
        ("/v1/tokenize", {"model": "probe-fitted", "text": ["the dog"]}, 422),
        ("/v1/encode", {"model": "probe-fitted", "inputs": ["the dog"], "pooling": "mean"}, 422),
        ("/v1/embeddings", {"model": "probe-fitted", "input": ["the dog"]}, 400),  # OpenAI's
    ]:
        answer = httpx.post(server.url + path, json=body, timeout=30)
        assert answer.status_code == status, (path, answer.text)
        error = answer.json()["error"]
        message = error if isinstance(error, str) else error["message"]  # OpenAI's shape
        assert "tokenizer of model 'probe-fitted' cannot encode" in message, answer.text
    known = {"model": "probe-fitted", "inputs": ["the cat"], "pooling": "mean"}
    assert httpx.post(f"{server.url}/v1/encode", json=known, timeout=30).status_code == 200


# -- a manifest promising more than its graphs and tokenizer hold ------------------------


def with_added_token(text_model: Path, target: Path, token_id: int) -> None:
    """A copy of the text model whose tokenizer.json adds a token at ``token_id`` (in its
    vocabulary: an added token's own id is renumbered on load), its digest recorded."""

    def edit(raw: dict[str, Any]) -> None:
        path = target / graph_io.TOKENIZER_FILE
        tokenizer = json.loads(path.read_text())
        tokenizer["model"]["vocab"]["hostiletoken"] = token_id
        tokenizer["added_tokens"].append(
            {"id": token_id, "content": "hostiletoken", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": False}
        )  # fmt: skip
        path.write_text(json.dumps(tokenizer))
        raw["text"]["tokenizer_sha256"] = sha256_file(path)

    copy_as(text_model, target, edit)


@pytest.fixture(scope="module")
def overpromising(text_models: Path) -> Path:
    """Copies of the text model (positions 0..127, 256 words, 2 token types) whose
    config.json or tokenizer promise more."""
    text = text_models / "text"
    copy_as(
        text,
        text_models / "long-window",
        lambda raw: (
            raw["architecture"].update(max_seq_len=512),
            raw["text"].update(max_positions=512),
        ),
    )
    copy_as(text, text_models / "big-vocab", lambda raw: raw["text"].update(vocab_size=4096))
    copy_as(text, text_models / "many-types", lambda raw: raw["text"].update(type_vocab_size=9))
    with_added_token(text, text_models / "added-token", 40_000_000)
    return text_models


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("long-window", "embeddings.onnx cannot run 512 tokens (max_seq_len)"),
        ("big-vocab", "embeddings.onnx cannot run token id 4095 and token type 1"),
        ("many-types", "embeddings.onnx cannot run token id 255 and token type 8"),
        (
            "added-token",
            "its tokenizer holds token 'hostiletoken' with id 40000000, beyond the vocabulary "
            "of 256",
        ),
    ],
)
def test_a_manifest_promising_more_than_its_tables_is_refused_at_load(
    server: ServerProcess, hostile: Path, overpromising: Path, name: str, says: str
) -> None:
    """Each loaded, then every request past the graph's tables (a long text, an id or
    token type the manifest allows, the added token) was a 500."""
    answer = load(server, name)
    assert_refused_cleanly(answer, hostile, says)
    assert httpx.get(f"{server.url}/v2/models/{name}/ready").status_code == 404
    assert httpx.get(f"{server.url}/health/ready").status_code == 200


# -- a load that runs long -----------------------------------------------------------------

HUGE = 48 << 30  # a sparse file: no disk, but minutes of hashing before the bound and shutdown


def state(server: ServerProcess, name: str) -> str:
    index = httpx.post(f"{server.url}/v2/repository/index", timeout=30).json()
    return next(entry["state"] for entry in index if entry["name"] == name)


@pytest.mark.slow  # the load is answered at the end of the 27.5 s grace window
def test_a_slow_load_blocks_neither_other_loads_nor_shutdown(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """config.json names a huge file: its hashing runs (off the event loop) while another
    model loads beside it; at SIGTERM the slow load is answered 503 shutting_down with
    Retry-After, its hashing gives up, and the process exits 0 without its watchdog."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_model_dir, repo / "tiny")
    copy_as(tiny_model_dir, repo / "other")
    slow = copy_as(tiny_model_dir, repo / "slow", text_section(embeddings_graph="huge.bin"))
    with (slow / "huge.bin").open("wb") as f:
        f.truncate(HUGE)
    settings = {"model_memory_bytes": str(2 * HUGE), "shutdown_timeout": "30"}
    with server_process(repo, model_control="explicit", default_model="tiny", **settings) as s:
        answers: dict[str, httpx.Response] = {}
        loading = threading.Thread(target=lambda: answers.update(slow=load(s, "slow")))
        loading.start()
        wait_until(lambda: state(s, "slow") == "LOADING", "the slow load never started")
        assert load(s, "other").status_code == 200  # not queued behind the slow one
        assert state(s, "slow") == "LOADING"
        assert httpx.get(f"{s.url}/health/ready").status_code == 200
        s.proc.send_signal(signal.SIGTERM)
        loading.join(timeout=60)
        answer = answers["slow"]
        assert answer.status_code == 503, answer.text
        assert answer.json()["error_type"] == "shutting_down" and "retry-after" in answer.headers
        assert s.proc.wait(timeout=60) == 0
        assert "shutdown timeout reached" not in s.log(), s.log()


def test_files_beyond_the_memory_budget_are_refused_before_hashing(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """At start too (it hashed the whole file, for minutes, then failed on its digest)."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_model_dir, repo / "tiny")
    slow = copy_as(tiny_model_dir, repo / "slow", text_section(embeddings_graph="huge.bin"))
    with (slow / "huge.bin").open("wb") as f:
        f.truncate(HUGE)
    with (
        pytest.raises(ServerFailed) as failed,
        server_process(repo),
    ):
        pytest.fail("the server became ready")  # pragma: no cover
    assert failed.value.returncode != 0
    assert "more than the 8,192 MiB it may take" in failed.value.log, failed.value.log


def test_a_tokenizer_swapped_after_its_digest_was_checked_is_refused(
    text_models: Path, tmp_path: Path
) -> None:
    """The tokenizer is read once, its bytes checked against the manifest's SHA-256 as
    they are read: one swapped in between the load's hashing and its reading (the
    link-check race's twin) is refused, never served. Before, the tokenizer was opened
    again by path after the hashing, so the swapped one loaded and served."""
    model = tmp_path / "repo" / "text"
    shutil.copytree(text_models / "text", model)
    settings = Settings(model_repository=tmp_path / "repo")
    info = read_model_info(model, settings)  # every file hashed and found as recorded
    wordpiece(["the", "dog"], "[UNK]").save(str(model / graph_io.TOKENIZER_FILE))
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json is corrupt"):
        TextFrontEnd.load(info)
