"""LLM rerankers (Qwen3-Reranker's kind) served, against sentence-transformers and the
model card's yes/no softmax.

The model is a small random-initialised ``Qwen3ForCausalLM`` (2 layers, hidden 32,
4 query heads over 2 key-value heads, untied LM head) with a byte-level BPE tokenizer
trained here, holding "yes", "no" and the template's special tokens, and the
Qwen3-Reranker chat template (``chat_template.jinja``: system judge prompt, ``<Instruct>:``
the system message or the model card's default, ``<Query>:``, ``<Document>:``, the empty
think block). It is saved as sentence-transformers 6 saves a CrossEncoder over a causal
LM (Transformer + LogitScore, a default prompt, max_seq_length 160), exported by the CLI
and served. References run in-process on the same folder: ``CrossEncoder.predict``
(its prompt the instruction) for scores and order on every rerank route (≤ 1e-5), and,
written here from the model card, softmax([logit(no), logit(yes)]) at the last token of
the model-card prompt (≤ 1e-5): the template the service fills is the card's. Positive
controls: the same comparison fails with yes and no swapped, with the logits one token
early, and with the instruction left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import running_server

SCORE_ATOL = 1e-5
ATTENTION_ATOL = 1e-4
MAX_LENGTH = 160
NAME = "qwen3-reranker"
SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
CARD_DEFAULT = "Given a web search query, retrieve relevant passages that answer the query"
PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
TEMPLATE = (
    PREFIX
    + '<Instruct>: {{ messages | selectattr("role", "eq", "system") | map(attribute="content")'
    + f' | first | default("{CARD_DEFAULT}") }}}}\n'
    + '<Query>: {{ messages | selectattr("role", "eq", "query") | map(attribute="content")'
    + " | first }}\n"
    + '<Document>: {{ messages | selectattr("role", "eq", "document")'
    + ' | map(attribute="content") | first }}'
    + SUFFIX
    + "\n"  # Jinja drops a template's last newline
)
DEFAULT_INSTRUCTION = "Given a question about animals, find passages that answer it"
INSTRUCTION = "Find passages about foxes"
QUERY = "what does the quick fox do"
DOCUMENTS = [
    "the quick brown fox jumps over the lazy dog",
    "yes no yes no",
    "attention maps of every layer",
    "a",
    "the lazy dog sleeps while the fox runs " * 12,  # cut to fit max_seq_length
]
CORPUS = [SYSTEM, CARD_DEFAULT, DEFAULT_INSTRUCTION, INSTRUCTION, QUERY, *DOCUMENTS] * 10


def _tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([*CORPUS, "yes no <Instruct>: <Query>: <Document>:"], trainer)
    tokenizer.add_tokens(["<think>", "</think>"])
    assert tokenizer.token_to_id("yes") is not None and tokenizer.token_to_id("no") is not None
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)


def build_reranker(folder: Path) -> None:
    """The causal LM and its tokenizer saved, then read and saved again as a CrossEncoder
    (modules.json: Transformer + LogitScore) with a default prompt."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    raw = folder.parent / f"{folder.name}-raw"
    _tokenizer(raw)
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(AutoTokenizer.from_pretrained(str(raw))),
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=0.2,  # scores spread well beyond the tolerance
    )
    Qwen3ForCausalLM(config).save_pretrained(raw)
    model = CrossEncoder(
        str(raw),
        prompts={"animals": DEFAULT_INSTRUCTION},
        default_prompt_name="animals",
        max_length=MAX_LENGTH,
    )
    model.save_pretrained(str(folder))


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the CrossEncoder folder, the model repository it is exported into)."""
    from model_export.cli import main

    root = tmp_path_factory.mktemp("llm-reranker")
    folder = root / "folder"
    build_reranker(folder)
    repository = root / "models"
    args = ["--checkpoint", str(folder), "--out", str(repository / NAME)]
    assert main([*args, "--no-compact-attention"]) == 0
    return folder, repository


@pytest.fixture(scope="module")
def url(reranker: tuple[Path, Path]) -> Iterator[str]:
    with running_server(reranker[1]) as base:
        yield base


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def cross_encoder(folder: Path, instruction: str | None) -> np.ndarray:
    """CrossEncoder.predict's scores (its prompt: the instruction; None: the default)."""
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder))
    assert model.max_seq_length == MAX_LENGTH
    pairs = [(QUERY, d) for d in DOCUMENTS]
    return np.asarray(model.predict(pairs, prompt=instruction), dtype=np.float64)


def card_logits(folder: Path, instruction: str, document: str, *, back: int = 1) -> np.ndarray:
    """The model card's reference: (logit(no), logit(yes)) at the token ``back`` from the
    end of ``prefix + <Instruct>: ... <Query>: ... <Document>: ... + suffix``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text = f"{PREFIX}<Instruct>: {instruction}\n<Query>: {QUERY}\n<Document>: {document}{SUFFIX}"
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -back]
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    return logits[[no, yes]].double().numpy()


def softmax_yes(logits: np.ndarray) -> float:
    e = np.exp(logits - logits.max())
    return float(e[1] / e.sum())


def by_index(results: list[dict[str, Any]], key: str) -> np.ndarray:
    got = np.full(len(DOCUMENTS), np.nan)
    for r in results:
        got[r["index"]] = r[key]
    return got


def order_of(scores: np.ndarray) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


@pytest.mark.parametrize("instruction", [None, INSTRUCTION, ""])
def test_scores_and_order_equal_the_cross_encoder_on_every_route(
    url: str, reranker: tuple[Path, Path], instruction: str | None
) -> None:
    """/v1/rerank, /v2/rerank (Cohere v2), TEI /rerank and the OIP model: the
    CrossEncoder's scores and order with the folder's default prompt (no instruction
    sent), an instruction of the request's, and none (""): the template's default."""
    want = cross_encoder(reranker[0], instruction)
    assert np.ptp(want) > 100 * SCORE_ATOL  # the order is decided well beyond the tolerance
    extra = {} if instruction is None else {"instruction": instruction}
    for path in ("/v1/rerank", "/v2/rerank"):
        answer = post(url, path, {"query": QUERY, "documents": DOCUMENTS, **extra})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        np.testing.assert_allclose(by_index(results, "relevance_score"), want, atol=SCORE_ATOL)
        assert [r["index"] for r in results] == order_of(want)
    tei = post(url, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "truncate": True, **extra})
    assert tei.status_code == 200, tei.text
    np.testing.assert_allclose(by_index(tei.json(), "score"), want, atol=SCORE_ATOL)
    assert [r["index"] for r in tei.json()] == order_of(want)
    oip = post(
        url,
        f"/v2/models/{NAME}/infer",
        {
            "inputs": [
                {"name": "query", "datatype": "BYTES", "shape": [1], "data": [QUERY]},
                {
                    "name": "documents",
                    "datatype": "BYTES",
                    "shape": [len(DOCUMENTS)],
                    "data": DOCUMENTS,
                },
            ],
            "parameters": extra,
        },
    )
    assert oip.status_code == 200, oip.text
    (scores,) = oip.json()["outputs"]
    np.testing.assert_allclose(scores["data"], want, atol=SCORE_ATOL)


def test_the_instruction_changes_the_scores_as_the_reference_does(
    url: str, reranker: tuple[Path, Path]
) -> None:
    """The SDK's ``instruction`` gives the reference's scores; positive control: served
    with another instruction than the reference's, the scores differ from it beyond
    the tolerance."""
    from attnserve_client import Client

    want = cross_encoder(reranker[0], INSTRUCTION)
    with Client(url) as client:
        ranked = client.rerank(QUERY, DOCUMENTS, instruction=INSTRUCTION)
    got = np.full(len(DOCUMENTS), np.nan)
    for r in ranked.results:
        got[r.index] = r.relevance_score
    np.testing.assert_allclose(got, want, atol=SCORE_ATOL)
    other = post(url, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
    got = by_index(other.json()["results"], "relevance_score")
    assert np.abs(got - want).max() > 100 * SCORE_ATOL


def test_scores_equal_the_model_cards_yes_no_softmax(url: str, reranker: tuple[Path, Path]) -> None:
    """Written from the model card: softmax over (no, yes) at the last token of the
    card's prompt, the raw score its log-odds; positive controls: yes and no swapped,
    and the logits read one token early, miss it."""
    folder = reranker[0]
    body = {"query": QUERY, "documents": DOCUMENTS[:4], "instruction": INSTRUCTION}
    served = by_index(post(url, "/v1/rerank", body).json()["results"], "relevance_score")[:4]
    raw_body = {**body, "raw_scores": True}
    raw = by_index(post(url, "/v1/rerank", raw_body).json()["results"], "relevance_score")[:4]
    for i, document in enumerate(DOCUMENTS[:4]):
        logits = card_logits(folder, INSTRUCTION, document)
        assert served[i] == pytest.approx(softmax_yes(logits), abs=SCORE_ATOL)
        assert raw[i] == pytest.approx(logits[1] - logits[0], abs=10 * SCORE_ATOL)
        # Positive controls: what a wrong answer row or a wrong position would give.
        assert abs(served[i] - softmax_yes(logits[::-1])) > 100 * SCORE_ATOL
        early = card_logits(folder, INSTRUCTION, document, back=2)
        assert abs(served[i] - softmax_yes(early)) > 100 * SCORE_ATOL


def test_the_scores_graph_reads_two_rows_of_the_lm_head(reranker: tuple[Path, Path]) -> None:
    """The scores graph holds the two answer rows ([2, d]), never the [vocab, d] LM head:
    its only [vocab, d] matrix is the token embedding table."""
    import json

    import onnx
    from transformers import AutoConfig

    folder, repository = reranker
    config = AutoConfig.from_pretrained(str(folder))
    graph = onnx.load(str(repository / NAME / "scores_model.onnx"), load_external_data=False)
    shapes = [tuple(t.dims) for t in graph.graph.initializer]
    assert shapes.count((config.vocab_size, config.hidden_size)) == 1
    assert (2, config.hidden_size) in shapes
    head = json.loads((repository / NAME / "config.json").read_text())["head"]
    assert head["llm"]["answers"] == ["yes", "no"]
    assert head["llm"]["default_instruction"] == DEFAULT_INSTRUCTION


def test_why_it_ranked_is_the_last_tokens_attention_to_the_document(
    url: str, reranker: tuple[Path, Path]
) -> None:
    """A causal reranker's query never attends to the document after it: the
    explanation's rows are the last token's (where yes or no is read), its columns the
    document's tokens, equal to the model's eager attentions (≤ 1e-4)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = reranker[0]
    document = DOCUMENTS[0]
    body = {
        "query": QUERY,
        "documents": [document],
        "instruction": INSTRUCTION,
        "return_attention": True,
        "top_tokens": 3,
    }
    answer = post(url, "/v1/rerank", body)
    assert answer.status_code == 200, answer.text
    explanation = answer.json()["results"][0]["explanation"]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text = f"{PREFIX}<Instruct>: {INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {document}{SUFFIX}"
    encoded = tokenizer(text, add_special_tokens=False)
    ids = torch.tensor([encoded["input_ids"]])
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    # The document's tokens: from the one after "<Document>:" to the one before the suffix.
    start = len(tokenizer(text[: text.index(document)].rstrip(" "))["input_ids"])
    stop = len(tokens) - len(tokenizer(SUFFIX)["input_ids"])
    assert explanation["document_tokens"] == tokens[start:stop]
    assert tokenizer.convert_tokens_to_string(tokens[start:stop]).strip() == document
    assert explanation["query_tokens"] == tokens[-1:]
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager")
    with torch.no_grad():
        maps = torch.cat(model.eval()(input_ids=ids, output_attentions=True).attentions).numpy()
    want = maps[:, :, -1:, start:stop]  # [L, H, 1, d]
    got = np.asarray(explanation["attention"], dtype=np.float32)
    np.testing.assert_allclose(got, want, atol=ATTENTION_ATOL, rtol=0)
    assert np.abs(want).max() > 100 * ATTENTION_ATOL  # not all zeros


def test_what_an_llm_reranker_does_not_take_is_refused(url: str) -> None:
    """/predict (pairs through the tokenizer's pair template, not the prompt) is a 422
    naming the rerank route; an instruction that is not text is a 422 naming it."""
    refused = post(url, "/predict", {"inputs": [["a", "b"]]})
    assert refused.status_code == 422 and "/v1/rerank" in refused.text, refused.text
    bad = post(url, "/v1/rerank", {"query": "q", "documents": ["d"], "instruction": 3})
    assert bad.status_code == 422 and "instruction" in bad.text, bad.text


def test_a_qwen2_reranker_with_tied_embeddings_and_its_own_answers(tmp_path: Path) -> None:
    """mxbai-rerank-v2's shape, in-process (no export): a Qwen2ForCausalLM (q/k/v
    biases) whose LM head is tied to its embeddings, saved as a CrossEncoder whose
    LogitScore names its own answer tokens ("1" and "0"); the imported head (two rows
    of the embedding table) on the prompt the manifest's template builds equals
    CrossEncoder.predict's raw log-odds (≤ 1e-5)."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder.modules import LogitScore, Transformer
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from model_export.heads import HeadGraph
    from model_export.hf_import import load_checkpoint

    raw = tmp_path / "raw"
    _tokenizer(raw)
    tokenizer = AutoTokenizer.from_pretrained(str(raw))
    torch.manual_seed(1)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    Qwen2ForCausalLM(config).save_pretrained(raw)
    true_id, false_id = tokenizer.convert_tokens_to_ids("1"), tokenizer.convert_tokens_to_ids("0")
    assert isinstance(true_id, int) and isinstance(false_id, int)
    transformer = Transformer(str(raw), transformer_task="text-generation")
    folder = tmp_path / "folder"
    CrossEncoder(modules=[transformer, LogitScore(true_id, false_id)]).save_pretrained(str(folder))
    reference = CrossEncoder(str(folder), activation_fn=torch.nn.Identity())
    want = reference.predict([(QUERY, d) for d in DOCUMENTS[:4]], prompt=INSTRUCTION)

    checkpoint = load_checkpoint(folder)
    head = checkpoint.head
    assert head is not None and head.llm is not None
    assert head.llm.answers == ("1", "0") and head.llm.answer_ids == (true_id, false_id)
    template, fixed = head.llm.prompt(INSTRUCTION)
    fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
    graph = HeadGraph(checkpoint.embeddings, checkpoint.encoder, head.module).eval()
    for document, expected in zip(DOCUMENTS[:4], want, strict=True):
        text, _ = template.render({**fixed, "query": QUERY, "document": document})
        ids = torch.tensor([fast.encode(text, add_special_tokens=False).ids])
        with torch.no_grad():
            got = graph(ids, torch.zeros_like(ids), torch.ones_like(ids))
        assert float(got[0, 0]) == pytest.approx(float(expected), abs=SCORE_ATOL)


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda t: t.replace("first }}\n<Document>", "first | upper }}\n<Document>"), "changes"),
        (lambda t: t[: t.index("\n<Document>")] + SUFFIX, "leaves out the document"),
        (lambda t: t.replace("<Query>: {{", "<Query>: {{ raise_exception('no') }}{{"), "refused"),
    ],
)
def test_a_template_that_does_not_only_place_the_texts_is_refused(
    tmp_path: Path, change: Any, refusal: str
) -> None:
    """A chat template that transforms a text, leaves out the document or raises is
    refused at export, naming why (the service could not fill it in)."""
    from model_export.hf_import import CheckpointError
    from model_export.llm_rerank import split_template

    with pytest.raises(CheckpointError, match=refusal):
        split_template(change(TEMPLATE), {}, instruction=True)
