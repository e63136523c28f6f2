"""Decoder embedders of the Llama lineage (Qwen3, Qwen2, Llama, Mistral), served and
checked against transformers eager as sentence-transformers runs them.

No package here ships their weights, so each is a small random-initialised checkpoint
that ``transformers`` builds and saves with ``save_pretrained``: Qwen3 with grouped-query
attention (4 query heads over 2 key/value heads), a head size of 16 where 32 / 4 is 8,
and per-head q/k RMSNorms; Qwen2 with biased q, k and v and a bias-free o; Llama with one
key/value head for all four; Mistral sliding every layer's causal window over 3 tokens.
Their tokenizer is a small byte-level BPE trained here whose post-processor appends
``<|endoftext|>`` and no BOS, as Qwen3-Embedding's does (``$A <|endoftext|>``).

The reference batch is what sentence-transformers feeds these models: the texts LEFT
padded together, one ``attn_implementation="eager"`` forward. We pad on the right and
answer each text's real tokens; those must equal the reference's real tokens (the last
n of each row): last hidden state, every hidden state and every attention map within
1e-4, over ``/v1/encode`` and ``/v2``. Causal attention makes a real token blind to the
padding on either side, which is why the sides may differ.

The Qwen3 checkpoint is served from a sentence-transformers folder shaped like
Qwen3-Embedding's (Transformer with the tokenizer padding on the left, last-token
Pooling with the prompt included, Normalize, its ``query`` instruction and empty
``document`` prompt, no default prompt): through ``/v1/embeddings`` and ``/v1/encode``
its vectors equal
``SentenceTransformer(folder).encode(texts, prompt_name=...)`` within 1e-5.

Controls, each showing the comparison can fail: key/value heads grouped the wrong way
(tiled instead of each repeated for its queries), the causal mask off, Mistral's window
off, and the last token read at the wrong padding side.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules.normalize import Normalize
from sentence_transformers.base.modules.transformer import Transformer
from sentence_transformers.sentence_transformer.modules.pooling import Pooling as STPooling
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from model_export.hf_import import Checkpoint, CheckpointError, config_from_hf, load_checkpoint
from model_export.manifest import Manifest
from model_export.model import Encoder, EncoderOutput
from tests.conftest import running_server

ATOL = 1e-4
ST_ATOL = 1e-5
CONTROL = 1e-3  # what a control must differ by, at least
SIZES = {"hidden": 32, "heads": 4, "layers": 2, "ff": 64}
EOT = "<|endoftext|>"
# Ragged on purpose: the batch is padded (left by the reference, right by us).
TEXTS = [
    "The attention maps of every decoder are served.",
    "Short one.",
    "Naïve café: the last token reads the whole text, 东京 too.",
]
CORPUS = [*TEXTS, "the quick brown fox jumps over the lazy dog " * 4, "Instruct: Query:"] * 20
MISTRAL_WINDOW = 3  # transformers' sliding_window: key j for query i when i - 3 < j <= i
ST_MODEL = "qwen3"  # served from the Qwen3-Embedding-shaped folder
QWEN3_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the "
    "query\nQuery:",
    "document": "",
}
PROMPT_NAMES = [None, "query", "document"]


def _tokenizer() -> Tokenizer:
    """Qwen's kind: byte-level BPE, no BOS, ``<|endoftext|>`` (id 0) appended."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[EOT, "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {EOT}:0", pair=f"$A:0 {EOT}:0 $B:1 {EOT}:1", special_tokens=[(EOT, 0)]
    )
    return tokenizer


def _qwen3(vocab: int) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(**_sizes(vocab), num_key_value_heads=2, head_dim=16)
    model: torch.nn.Module = Qwen3Model(config)
    return model


def _qwen2(vocab: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2Model

    model: torch.nn.Module = Qwen2Model(Qwen2Config(**_sizes(vocab), num_key_value_heads=2))
    return model


def _llama(vocab: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaModel

    model: torch.nn.Module = LlamaModel(LlamaConfig(**_sizes(vocab), num_key_value_heads=1))
    return model


def _mistral(vocab: int) -> torch.nn.Module:
    from transformers import MistralConfig, MistralModel

    config = MistralConfig(**_sizes(vocab), num_key_value_heads=2, sliding_window=MISTRAL_WINDOW)
    model: torch.nn.Module = MistralModel(config)
    return model


def _sizes(vocab: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "hidden_size": SIZES["hidden"],
        "num_attention_heads": SIZES["heads"],
        "num_hidden_layers": SIZES["layers"],
        "intermediate_size": SIZES["ff"],
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "bos_token_id": None,
        "eos_token_id": 0,
        "pad_token_id": 0,
    }


DECODERS: dict[str, Callable[[int], torch.nn.Module]] = {
    "qwen3": _qwen3,
    "qwen2": _qwen2,
    "llama": _llama,
    "mistral": _mistral,
}


def _checkpoint(directory: Path, make_model: Callable[[int], torch.nn.Module]) -> None:
    """A random-initialised checkpoint with its tokenizer, as ``save_pretrained`` writes
    them (the tokenizer padding on the left, as Qwen3-Embedding's tokenizer_config says)."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = _tokenizer()
    torch.manual_seed(0)
    model = make_model(tokenizer.get_vocab_size())
    # Random norms (q/k norms too) and biases, so a mapping slip between them cannot pass;
    # queries and keys scaled up, as a random init leaves attention near-uniform.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.2)
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(5.0)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.5)
    model.save_pretrained(directory)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOT, pad_token=EOT, padding_side="left"
    )
    fast.save_pretrained(directory)


def _st_folder(qwen3: Path, folder: Path) -> None:
    """A sentence-transformers folder shaped like Qwen3-Embedding's, saved by
    sentence-transformers from the Qwen3 checkpoint; its pooling config written in the
    older flags the real one carries."""
    model = SentenceTransformer(
        modules=[
            Transformer(str(qwen3)),
            STPooling(SIZES["hidden"], pooling_mode="lasttoken", include_prompt=True),
            Normalize(),
        ],
        prompts=QWEN3_PROMPTS,
        default_prompt_name=None,
        device="cpu",
    )
    model.save(str(folder))
    flags = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
    flags += ("weightedmean_tokens", "lasttoken")
    pooling = {"word_embedding_dimension": SIZES["hidden"]}
    pooling |= {f"pooling_mode_{flag}": flag == "lasttoken" for flag in flags}
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(pooling | {"include_prompt": True})
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each decoder's checkpoint; Qwen3's inside the Qwen3-Embedding-shaped folder (one
    export fewer: the folder's Transformer is that checkpoint, at the folder's root)."""
    made = {}
    for name, make_model in DECODERS.items():
        made[name] = tmp_path_factory.mktemp(f"ckpt-{name}")
        _checkpoint(made[name], make_model)
    folder = tmp_path_factory.mktemp("st") / ST_MODEL
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")  # local folders: nothing to download
        _st_folder(made[ST_MODEL], folder)
    made[ST_MODEL] = folder
    return made


@pytest.fixture(scope="module")
def repo(sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_export.cli import main

    repo = tmp_path_factory.mktemp("decoders")
    for name, source in sources.items():
        command = ["--checkpoint", str(source), "--name", name, "--out", str(repo / name)]
        # No compact graph (CI time): compact attention is tested in test_compact_attention.
        assert main([*command, "--no-compact-attention"]) == 0
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[str]:
    with running_server(repo, intra_op_threads="2") as url:
        yield url


@pytest.fixture(scope="module")
def st_model(sources: dict[str, Path]) -> SentenceTransformer:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        return SentenceTransformer(str(sources[ST_MODEL]), device="cpu")


def _decode(array: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(array["data"]), dtype="<f4").reshape(array["shape"])


def _ids(source: Path, texts: list[str]) -> list[list[int]]:
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_padding()
    return [tokenizer.encode(text).ids for text in texts]


def _padded(ids: list[list[int]], *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask (B, T), padded with id 0 on the ``left`` or right."""
    width = max(map(len, ids))
    batch = torch.zeros(len(ids), width, dtype=torch.int64)
    mask = torch.zeros(len(ids), width, dtype=torch.int64)
    for row, sequence in enumerate(ids):
        span = slice(width - len(sequence), width) if left else slice(0, len(sequence))
        batch[row, span] = torch.tensor(sequence)
        mask[row, span] = 1
    return batch, mask


class Reference:
    """transformers eager on the texts left-padded together, read back per text on its
    real tokens (the last n positions of its row)."""

    def __init__(self, source: Path, texts: list[str]) -> None:
        from transformers import AutoModel

        self.ids = _ids(source, texts)
        model = AutoModel.from_pretrained(source, attn_implementation="eager").eval()
        input_ids, mask = _padded(self.ids, left=True)
        with torch.no_grad():
            self.out = model(
                input_ids=input_ids,
                attention_mask=mask,
                output_attentions=True,
                output_hidden_states=True,
            )
        self.width = input_ids.shape[1]

    def real(self, row: int) -> slice:
        return slice(self.width - len(self.ids[row]), self.width)

    def hidden(self, row: int) -> np.ndarray:  # (n, d)
        return self.out.last_hidden_state[row, self.real(row)].numpy()

    def states(self, row: int) -> np.ndarray:  # (L + 1, n, d)
        return np.stack([s[row, self.real(row)].numpy() for s in self.out.hidden_states])

    def maps(self, row: int) -> np.ndarray:  # (L, h, n, n)
        real = self.real(row)
        return np.stack([a[row, :, real, real].numpy() for a in self.out.attentions])


@pytest.fixture(scope="module")
def references(sources: dict[str, Path]) -> dict[str, Reference]:
    return {name: Reference(sources[name], TEXTS) for name in DECODERS}


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=what)


@pytest.mark.parametrize("name", list(DECODERS))
def test_served_decoder_equals_eager_left_padded(
    name: str, sources: dict[str, Path], references: dict[str, Reference], server: str
) -> None:
    body = {
        "model": name,
        "inputs": TEXTS,
        "return_attention": True,
        "return_hidden_states": True,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{server}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    want = references[name]
    layers, heads = SIZES["layers"], SIZES["heads"]
    lengths = {len(ids) for ids in want.ids}
    assert len(lengths) == len(TEXTS)  # ragged: every row of the reference is padded but one
    for row, item in enumerate(r.json()["data"]):
        assert item["tokens"][-1] == EOT  # the token last-token pooling reads
        n = len(want.ids[row])
        _close(_decode(item["embeddings"]), want.hidden(row), f"{name} hidden, text {row}")
        states = _decode(item["hidden_states"])
        assert states.shape == (layers + 1, n, SIZES["hidden"])
        _close(states, want.states(row), f"{name} hidden states, text {row}")
        attention = _decode(item["attention"])
        assert attention.shape == (layers, heads, n, n)  # one map per query head
        _close(attention, want.maps(row), f"{name} attention, text {row}")
        assert (np.triu(attention, k=1) == 0).all()  # causal: nothing after the query
        if name == "mistral":
            # Keys 3 or more behind the query get weight 0: the window cuts these texts.
            offset = np.arange(n)[:, None] - np.arange(n)[None, :]  # (T, T): i - j
            assert (want.maps(row)[:, :, offset >= MISTRAL_WINDOW] == 0).all()
            assert (offset >= MISTRAL_WINDOW).any()


@pytest.mark.parametrize("name", list(DECODERS))
def test_open_inference_protocol_serves_each_decoder_as_eager(
    name: str, references: dict[str, Reference], server: str
) -> None:
    """/v2, the texts as one BYTES batch: last hidden state, every hidden state and every
    map of each text's real tokens (the answer's attention_mask says which)."""
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}],
        "outputs": [
            {"name": "last_hidden_state"},
            {"name": "hidden_states"},
            {"name": "attentions"},
            {"name": "attention_mask"},
        ],
    }
    r = httpx.post(f"{server}/v2/models/{name}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}

    def array(output: str) -> np.ndarray:
        data = outputs[output]
        return np.asarray(data["data"]).reshape(data["shape"])

    mask = array("attention_mask")
    want = references[name]
    for row in range(len(TEXTS)):
        n = len(want.ids[row])
        assert mask[row].tolist() == [1] * n + [0] * (mask.shape[1] - n)  # ours: right padded
        _close(array("last_hidden_state")[row, :n], want.hidden(row), f"{name} /v2 hidden")
        _close(array("hidden_states")[row, :, :n], want.states(row), f"{name} /v2 states")
        _close(array("attentions")[row, :, :, :n, :n], want.maps(row), f"{name} /v2 maps")


# --- the Qwen3-Embedding-shaped sentence-transformers folder ---------------------------


def test_the_folder_is_shaped_like_qwen3_embedding(sources: dict[str, Path], repo: Path) -> None:
    folder = sources[ST_MODEL]
    assert json.loads((folder / "tokenizer_config.json").read_text())["padding_side"] == "left"
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == [
        "Transformer",
        "Pooling",
        "Normalize",
    ]
    st_config = json.loads((folder / "config_sentence_transformers.json").read_text())
    assert st_config["prompts"] == QWEN3_PROMPTS
    assert st_config["default_prompt_name"] is None
    manifest = Manifest.read(repo / ST_MODEL)
    assert (manifest.pooling, manifest.normalize, manifest.include_prompt) == ("last", True, True)
    assert (manifest.prompts, manifest.default_prompt_name) == (QWEN3_PROMPTS, None)


def _st_encode(model: SentenceTransformer, prompt_name: str | None) -> np.ndarray:
    kwargs = {} if prompt_name is None else {"prompt_name": prompt_name}
    return np.asarray(model.encode(TEXTS, **kwargs))


def _served_vectors(server: str, prompt_name: str | None) -> dict[str, np.ndarray]:
    option = {} if prompt_name is None else {"prompt_name": prompt_name}
    encode = httpx.post(
        f"{server}/v1/encode",
        json={"model": ST_MODEL, "inputs": TEXTS, "pooling": "last", "normalize": True, **option},
        timeout=60,
    )
    embeddings = httpx.post(
        f"{server}/v1/embeddings", json={"model": ST_MODEL, "input": TEXTS, **option}, timeout=60
    )
    for answer in (encode, embeddings):
        assert answer.status_code == 200, answer.text
    return {
        "encode": np.array([item["pooled"] for item in encode.json()["data"]]),
        "embeddings": np.array([item["embedding"] for item in embeddings.json()["data"]]),
    }


@pytest.mark.parametrize("prompt_name", PROMPT_NAMES)
def test_served_vectors_equal_sentence_transformers(
    server: str, st_model: SentenceTransformer, prompt_name: str | None
) -> None:
    assert st_model.tokenizer.padding_side == "left"  # the reference pads as the real one
    want = _st_encode(st_model, prompt_name)
    for route, got in _served_vectors(server, prompt_name).items():
        np.testing.assert_allclose(got, want, rtol=0, atol=ST_ATOL, err_msg=route)


def test_the_query_instruction_changes_the_vectors(
    server: str, st_model: SentenceTransformer
) -> None:
    """So the equality above checks that the prompt is applied, not only the pooling."""
    plain, query = _served_vectors(server, None), _served_vectors(server, "query")
    assert np.abs(plain["embeddings"] - query["embeddings"]).max() > 0.05


def test_a_truncated_text_keeps_its_end_of_text_token_as_sentence_transformers(
    server: str, st_model: SentenceTransformer
) -> None:
    """A query longer than the model's 128 positions: both cut the text and keep the
    post-processor's ``<|endoftext|>`` last, the token the vector is read from."""
    long = ["the quick brown fox jumps over the lazy dog " * 40, TEXTS[1]]
    want = np.asarray(st_model.encode(long, prompt_name="query"))
    body = {
        "model": ST_MODEL,
        "inputs": long,
        "pooling": "last",
        "normalize": True,
        "prompt_name": "query",
        "truncate": True,
    }
    r = httpx.post(f"{server}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    first = r.json()["data"][0]
    assert (len(first["tokens"]), first["tokens"][-1]) == (st_model.max_seq_length, EOT)
    got = np.array([item["pooled"] for item in r.json()["data"]])
    np.testing.assert_allclose(got, want, rtol=0, atol=ST_ATOL)


# --- controls: each shows the comparisons above can fail ------------------------------


def _ours(checkpoint: Checkpoint, ids: list[list[int]], encoder: Encoder | None = None) -> Any:
    """Our encoder in process on the texts right-padded together."""
    input_ids, mask = _padded(ids, left=False)
    with torch.no_grad():
        embeds = checkpoint.embeddings(input_ids, torch.zeros_like(input_ids))
        out: EncoderOutput = (encoder or checkpoint.encoder)(embeds, mask)
    return out


def _worst_hidden(out: EncoderOutput, want: Reference) -> float:
    return max(
        float(np.abs(out.hidden[row, : len(ids)].numpy() - want.hidden(row)).max())
        for row, ids in enumerate(want.ids)
    )


def _rebuilt(checkpoint: Checkpoint, **changes: Any) -> Encoder:
    """The checkpoint's encoder with its config changed, same weights."""
    encoder = Encoder(dataclasses.replace(checkpoint.encoder.config, **changes))
    encoder.load_state_dict(checkpoint.encoder.state_dict())
    return encoder


def test_grouped_query_heads_misgrouped_differ(
    sources: dict[str, Path], references: dict[str, Reference]
) -> None:
    """Qwen3's 2 key/value heads tiled over its 4 query heads (0, 1, 0, 1: ``repeat``)
    instead of each repeated for its group (0, 0, 1, 1: ``repeat_interleave``)."""
    checkpoint = load_checkpoint(sources["qwen3"])
    want = references["qwen3"]
    assert _worst_hidden(_ours(checkpoint, want.ids), want) <= ATOL
    misgrouped = _rebuilt(checkpoint)
    for layer in misgrouped.layers:
        attention = layer.attn
        groups = attention.n_heads // attention.kv_heads
        assert groups == 2
        attention._per_query_head = lambda x, groups=groups: x.repeat(1, groups, 1, 1)
    assert _worst_hidden(_ours(checkpoint, want.ids, misgrouped), want) > CONTROL


@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_without_the_causal_mask_the_hidden_states_differ(
    name: str, sources: dict[str, Path], references: dict[str, Reference]
) -> None:
    checkpoint = load_checkpoint(sources[name])
    assert checkpoint.encoder.config.causal
    bidirectional = _rebuilt(checkpoint, causal=False)
    want = references[name]
    assert _worst_hidden(_ours(checkpoint, want.ids, bidirectional), want) > CONTROL


def test_without_mistrals_window_the_hidden_states_differ(
    sources: dict[str, Path], references: dict[str, Reference]
) -> None:
    checkpoint = load_checkpoint(sources["mistral"])
    assert checkpoint.encoder.config.window == MISTRAL_WINDOW - 1
    want = references["mistral"]
    assert _worst_hidden(_ours(checkpoint, want.ids), want) <= ATOL
    unwindowed = _rebuilt(checkpoint, window=None)
    assert _worst_hidden(_ours(checkpoint, want.ids, unwindowed), want) > CONTROL


def test_the_last_token_read_at_the_wrong_padding_side_differs(
    sources: dict[str, Path], server: str, st_model: SentenceTransformer
) -> None:
    """Position -1 of our right-padded batch is padding for every text but the longest, and
    position n - 1 of sentence-transformers' left-padded batch is not the text's last token:
    either misreading is far from sentence-transformers' vectors (the served ones equal them)."""
    want = _st_encode(st_model, None)
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}],
        "outputs": [{"name": "last_hidden_state"}],
    }
    r = httpx.post(f"{server}/v2/models/{ST_MODEL}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (output,) = r.json()["outputs"]
    hidden = np.asarray(output["data"], np.float32).reshape(output["shape"])  # (B, T, d)
    lengths = [len(ids) for ids in _ids(sources[ST_MODEL], TEXTS)]

    def unit(vector: np.ndarray) -> np.ndarray:
        return vector / max(float(np.linalg.norm(vector)), 1e-12)

    right = np.stack([unit(hidden[row, n - 1]) for row, n in enumerate(lengths)])
    np.testing.assert_allclose(right, want, rtol=0, atol=ST_ATOL)  # the right reading
    shorter = [row for row, n in enumerate(lengths) if n < max(lengths)]
    assert shorter
    for row in shorter:
        assert np.abs(unit(hidden[row, -1]) - want[row]).max() > 0.05
    left = Reference(sources[ST_MODEL], TEXTS)
    for row in shorter:
        misread = unit(left.out.last_hidden_state[row, lengths[row] - 1].numpy())
        assert np.abs(misread - want[row]).max() > 0.05


# --- sliding windows: Qwen2's, and what is refused -------------------------------------


def test_qwen2_sliding_every_layer_equals_eager(tmp_path: Path) -> None:
    """Qwen2 with use_sliding_window and max_window_layers 0 slides every layer: our causal
    window of radius 2 for its sliding_window 3 (and the control: no window differs)."""
    from transformers import Qwen2Config, Qwen2Model

    def sliding(vocab: int) -> torch.nn.Module:
        config = Qwen2Config(
            **_sizes(vocab),
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=MISTRAL_WINDOW,
            max_window_layers=0,
        )
        model: torch.nn.Module = Qwen2Model(config)
        return model

    _checkpoint(tmp_path, sliding)
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.encoder.config.window == MISTRAL_WINDOW - 1
    want = Reference(tmp_path, TEXTS)
    out = _ours(checkpoint, want.ids)
    assert _worst_hidden(out, want) <= ATOL
    for row, ids in enumerate(want.ids):
        n = len(ids)
        assert out.attention is not None
        _close(out.attention[row, :, :, :n, :n].numpy(), want.maps(row), "qwen2 sliding maps")
    assert _worst_hidden(_ours(checkpoint, want.ids, _rebuilt(checkpoint, window=None)), want) > (
        CONTROL
    )


BASE_HF = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "vocab_size": 100,
    "hidden_act": "silu",
}


@pytest.mark.parametrize(
    ("overrides", "window"),
    [
        ({"model_type": "mistral", "sliding_window": 4096}, 4095),  # e5-mistral's
        ({"model_type": "mistral", "sliding_window": None}, None),
        # gte-Qwen2's: a window stated, not used
        ({"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 131072}, None),
        (
            {
                "model_type": "qwen3",
                "use_sliding_window": True,
                "sliding_window": 8,
                "max_window_layers": 0,
            },
            7,
        ),
        ({"model_type": "llama"}, None),
    ],
)
def test_sliding_windows_read(overrides: dict[str, Any], window: int | None) -> None:
    config = config_from_hf(BASE_HF | overrides)
    assert (config.causal, config.window) == (True, window)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            {
                "model_type": "qwen2",
                "use_sliding_window": True,
                "sliding_window": 8,
                "max_window_layers": 1,
            },
            "mixing full and sliding-window layers",
        ),
        (
            {"model_type": "qwen3", "layer_types": ["sliding_attention", "full_attention"]},
            "without a sliding_window",
        ),
        (
            {"model_type": "llama", "layer_types": ["sliding_attention"] * 2},
            "llama with sliding-window",
        ),
        ({"model_type": "mistral", "sliding_window": 1}, "sliding_window must be"),
        ({"model_type": "mistral", "sliding_window": "4096"}, "sliding_window must be"),
        ({"model_type": "qwen2", "max_window_layers": "x"}, "max_window_layers must be"),
        (
            {"model_type": "qwen2", "layer_types": ["chunked_attention"] * 2},
            "chunked_attention",
        ),
    ],
)
def test_windows_we_cannot_express_are_refused_by_name(
    overrides: dict[str, Any], named: str
) -> None:
    with pytest.raises(CheckpointError, match=named):
        config_from_hf(BASE_HF | overrides)


def test_the_int8_recipe_applies_to_a_decoder_embedder(repo: Path, tmp_path: Path) -> None:
    """The default int8 recipe on the Qwen3-shaped export (GQA, SwiGLU, RMSNorm): every
    attention and gate/up MatMul dynamic int8 after smoothing, each layer's down
    projection (which reads the SwiGLU product, not a GELU) 8-bit block-wise, and the
    copy's recorded agreement on its own texts within the recipe's cosine. Before the
    down projection was found by its SwiGLU, it was dynamic int8 like the rest."""
    from model_export.quantize import MIN_COSINE, quantize_model_dir

    quantize_model_dir(repo / ST_MODEL, tmp_path / "int8")
    manifest = Manifest.read(tmp_path / "int8")
    agreement = manifest.record["quantization"]["agreement"]
    assert agreement and all(s["cosine_min"] >= MIN_COSINE for s in agreement.values()), agreement
    layers = manifest.architecture.n_layers
    for graph in manifest.graphs:
        nodes = onnx.load(str(tmp_path / "int8" / graph)).graph.node
        ops = Counter(node.op_type for node in nodes)
        # q, k, v, o and the stacked gate/up per layer; the down projection block-wise.
        assert ops["MatMulInteger"] == 5 * layers, (graph, ops)
        assert ops["MatMulNBits"] == layers, (graph, ops)
        assert any(node.name.startswith("smooth_") for node in nodes), graph
