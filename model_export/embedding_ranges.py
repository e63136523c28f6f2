"""Per-dimension ranges of a model's sentence embeddings, for int8/uint8 answers.

sentence-transformers quantizes to int8/uint8 with each dimension's min and max over
a calibration set. The exporter computes them once, on sentences it draws itself
(``quantize_sentences``: held-in text, seeded), as the server answers sentence
vectors by default: the model's pooling (mean without a recipe), then its Dense
layers if any, L2-normalised, full width. They are recorded in the manifest
(``quantization_ranges``), the draw in its ``record``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from model_export.dense import DenseWeights, apply_dense
from model_export.model import Encoder, TokenEmbeddings
from model_export.quantize_sentences import sentences

CALIBRATION_SENTENCES, CALIBRATION_SEED = 1000, 7
BATCH = 64


def pooled(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """[B, T, d] -> [B, d] as the server pools a sequence's real tokens."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).amax(dim=1)
    if pooling == "last":
        return hidden[torch.arange(len(hidden)), mask.sum(dim=1) - 1]
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


@torch.no_grad()
def embedding_ranges(
    encoder: Encoder,
    embeddings: TokenEmbeddings,
    tokenizer_file: Path,
    pooling: str,
    dense: Sequence[DenseWeights] = (),
) -> tuple[tuple[tuple[float, ...], tuple[float, ...]], dict[str, Any]]:
    """(mins, maxes) per dimension of the model's normalised sentence vectors over the
    calibration sentences, and what to record of how they were drawn."""
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_padding()
    most = min(encoder.config.max_seq_len, embeddings.max_tokens)
    tokenizer.enable_truncation(max_length=most)
    # Batched by length: a min and a max do not depend on the order, and a batch of
    # like lengths pads little (minilm-l6: 15,800 tokens run instead of 25,408).
    every_text = tokenizer.encode_batch(sentences(CALIBRATION_SENTENCES, CALIBRATION_SEED))
    in_order = sorted(every_text, key=lambda e: len(e.ids))
    vectors = []
    for start in range(0, len(in_order), BATCH):
        encoded = in_order[start : start + BATCH]
        longest = max(len(e.ids) for e in encoded)
        ids = torch.zeros(len(encoded), longest, dtype=torch.int64)
        types = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        for row, e in enumerate(encoded):
            n = len(e.ids)
            ids[row, :n], types[row, :n], mask[row, :n] = (
                torch.tensor(e.ids),
                torch.tensor(e.type_ids),
                1,
            )
        hidden = encoder(embeddings(ids, types), mask, weights=False).hidden
        vector = apply_dense(pooled(hidden, mask, pooling), dense)
        vectors.append(torch.nn.functional.normalize(vector, dim=-1))
    every = torch.cat(vectors)
    mins = tuple(float(v) for v in every.amin(dim=0))
    maxes = tuple(float(v) for v in every.amax(dim=0))
    record = {
        "sentences": CALIBRATION_SENTENCES,
        "seed": CALIBRATION_SEED,
        "source": "model_export.quantize_sentences",
        "pooling": pooling,
        "dense": len(dense),
        "normalized": True,
    }
    return (mins, maxes), record
