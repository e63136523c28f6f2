"""Small random-initialised checkpoints with heads, saved as their users save them.

No package here ships a cross-encoder, a classifier or a SPLADE model, so each is
built by ``transformers`` (``*ForSequenceClassification``, ``*ForMaskedLM``) and
saved by ``save_pretrained`` or by sentence-transformers (``CrossEncoder.save``,
``SparseEncoder.save``): the folders a user brings. BERT's use the real MiniLM
WordPiece tokenizer (pairs: [CLS] q [SEP] d [SEP], token types 0/1); XLM-R's a
small Unigram one (pairs: <s> q </s></s> d </s>, no token types).

``HEAD_MODELS`` names each model of the repository ``head_repository`` builds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from model_export.hf_import import minilm_l6_dir

SIZES = {"hidden": 32, "heads": 4, "layers": 2, "ff": 64, "positions": 128}
CORPUS = [
    "what is attention in a transformer",
    "attention weighs every token by its relevance to the query",
    "the quick brown fox jumps over the lazy dog",
    "rerankers read the query and the document together",
    "sparse vectors keep a weight per vocabulary word",
] * 20
LABELS = ("negative", "neutral", "positive")


def _bert_tokenizer(directory: Path) -> None:
    from transformers import BertTokenizerFast

    source = minilm_l6_dir()
    tokenizer = BertTokenizerFast(
        tokenizer_file=str(source / "tokenizer.json"), vocab_file=str(source / "vocab.txt")
    )
    tokenizer.save_pretrained(directory)


def _unigram_tokenizer(directory: Path) -> None:
    """XLM-RoBERTa's kind: Unigram with ▁ word starts; pairs as <s> a </s></s> b </s>."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=specials, unk_token="<unk>")
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    fast.save_pretrained(directory)


def _randomised(model: torch.nn.Module) -> torch.nn.Module:
    """Norms and heads far from their init, so a mapping slip cannot pass unseen."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.lower():
                param.normal_(1.0, 0.1)
            elif name.endswith(("query.weight", "key.weight")):
                param.mul_(5.0)
            elif name.startswith(("classifier", "cls.", "lm_head")) and name.endswith("bias"):
                param.normal_(0.0, 0.5)
    return model


def _bert_config(**extra: object) -> object:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,
        hidden_size=SIZES["hidden"],
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=SIZES["layers"],
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"],
        **extra,
    )


def bert_encoder(directory: Path) -> None:
    """A plain random BERT encoder with MiniLM's tokenizer, as ``save_pretrained`` writes it."""
    from transformers import BertModel

    torch.manual_seed(0)
    _randomised(BertModel(_bert_config())).save_pretrained(directory)
    _bert_tokenizer(directory)


def bert_cross_encoder(directory: Path) -> None:
    """A one-logit BERT reranker saved by sentence-transformers' CrossEncoder (sigmoid)."""
    from sentence_transformers import CrossEncoder
    from transformers import BertForSequenceClassification

    raw = directory.with_name(directory.name + "-hf")
    torch.manual_seed(1)
    _randomised(BertForSequenceClassification(_bert_config(num_labels=1))).save_pretrained(raw)
    _bert_tokenizer(raw)
    CrossEncoder(str(raw), max_length=SIZES["positions"]).save(str(directory))


def bert_classifier(directory: Path) -> None:
    """A three-label BERT classifier (id2label named), as ``save_pretrained`` writes it."""
    from transformers import BertForSequenceClassification

    config = _bert_config(
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    torch.manual_seed(2)
    _randomised(BertForSequenceClassification(config)).save_pretrained(directory)
    _bert_tokenizer(directory)


def xlmr_cross_encoder(directory: Path) -> None:
    """A one-logit XLM-RoBERTa reranker (RoBERTa's classification head), save_pretrained."""
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    config = XLMRobertaConfig(
        vocab_size=200,
        hidden_size=SIZES["hidden"],
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=SIZES["layers"],
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"] + 2,
        type_vocab_size=1,
        pad_token_id=1,
        num_labels=1,
    )
    torch.manual_seed(3)
    _randomised(XLMRobertaForSequenceClassification(config)).save_pretrained(directory)
    _unigram_tokenizer(directory)


def bert_splade(directory: Path) -> None:
    """A BERT masked-LM saved as sentence-transformers' SparseEncoder (MLMTransformer +
    SpladePooling max/relu)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    from transformers import BertForMaskedLM

    raw = directory.with_name(directory.name + "-hf")
    torch.manual_seed(4)
    _randomised(BertForMaskedLM(_bert_config())).save_pretrained(raw)
    _bert_tokenizer(raw)
    modules = [MLMTransformer(str(raw), max_seq_length=SIZES["positions"]), SpladePooling("max")]
    SparseEncoder(modules=modules).save(str(directory))


# Model name in the repository -> how its checkpoint folder is made.
HEAD_MODELS: dict[str, Callable[[Path], None]] = {
    "bert-reranker": bert_cross_encoder,
    "bert-classifier": bert_classifier,
    "xlmr-reranker": xlmr_cross_encoder,
    "bert-splade": bert_splade,
}


def head_repository(root: Path) -> tuple[Path, dict[str, Path]]:
    """A model repository under ``root`` holding each of ``HEAD_MODELS`` exported by the
    CLI (torchscript: the fast exporter), and each model's checkpoint folder."""
    from model_export.cli import main

    repository, sources = root / "models", {}
    for name, build in HEAD_MODELS.items():
        source = root / "checkpoints" / name
        source.parent.mkdir(parents=True, exist_ok=True)
        build(source)
        out = str(repository / name)
        args = ["--checkpoint", str(source), "--out", out, "--exporter", "torchscript"]
        assert main(args) == 0, name
        sources[name] = source
    return repository, sources
