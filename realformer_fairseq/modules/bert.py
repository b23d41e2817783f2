"""BERT's pieces that fairseq's RoBERTa lacks, for BERT-exact encoder-only models.

Devlin et al. 2019 (BERT, google-research/bert ``modeling.py``) and He, Ravula, Kanagal,
Ainslie 2020 (RealFormer, arXiv 2012.11747, google-research ``realformer/realformer.py``, which
is BERT's ``modeling.py`` with residual attention): token-type (segment) embeddings with ids
derived from the separator when a fairseq task passes none, the pooler (dense + tanh on the
first token), a classification head on top of it (BERT's ``run_classifier``: pooled output ->
dropout -> output layer), and the LayerNorm epsilon (BERT's 1e-12).
"""

from typing import Iterator

import torch
from fairseq import utils
from fairseq.models.roberta.model import RobertaClassificationHead
from torch import Tensor, nn


def segment_ids_from_separator(src_tokens: Tensor, separator_idx: int, padding_idx: int) -> Tensor:
    """BERT token types of fairseq inputs: 0 up to and including the first ``separator_idx``
    (fairseq's ``</s>``, BERT's ``[SEP]``), 1 after it; padding 0.

    ``<s> A </s> B </s>`` (fairseq's ``sentence_prediction`` without ``--separator-token``) gets
    BERT's ``[CLS] A [SEP] B [SEP]`` ids ``0 0 0 1 1``; one sentence is all 0. With RoBERTa's
    ``<s> A </s> </s> B </s>`` the second ``</s>`` is 1 as well."""
    is_sep = src_tokens.eq(separator_idx).long()
    seps_before = torch.cumsum(is_sep, dim=1) - is_sep
    return (seps_before > 0).long().masked_fill(src_tokens.eq(padding_idx), 0)


class BertPooler(nn.Module):
    """``bert/pooler``: ``activation(dense(features[:, 0]))`` (tanh in BERT)."""

    def __init__(self, embed_dim: int, activation_fn: str):
        super().__init__()
        self.dense = nn.Linear(embed_dim, embed_dim)
        self.activation_fn = utils.get_activation_fn(activation_fn)

    def forward(self, features: Tensor) -> Tensor:
        return self.activation_fn(self.dense(features[:, 0, :]))


class BertClassificationHead(RobertaClassificationHead):
    """fairseq's :class:`RobertaClassificationHead` (same parameters ``dense``, ``out_proj``)
    computing BERT's classifier: ``out_proj(dropout(activation(dense(features[:, 0]))))``, i.e.
    the pooler, dropout, the output layer (google-research/bert ``run_classifier.create_model``
    and the next-sentence head). fairseq's head also applies the dropout before ``dense``."""

    def forward(self, features, **kwargs):
        x = self.activation_fn(self.dense(features[:, 0, :]))
        return self.out_proj(self.dropout(x))


def layer_norms(module: nn.Module) -> Iterator[nn.Module]:
    """Every LayerNorm in ``module`` (torch's, and apex's FusedLayerNorm that fairseq's
    ``LayerNorm`` returns on GPUs with apex)."""
    for m in module.modules():
        if isinstance(m, nn.LayerNorm) or type(m).__name__ == "FusedLayerNorm":
            yield m


def set_layer_norm_eps(module: nn.Module, eps: float) -> int:
    """Set the epsilon of every LayerNorm in ``module`` (fairseq builds them with its default
    1e-5); returns how many."""
    count = 0
    for norm in layer_norms(module):
        norm.eps = eps
        count += 1
    return count
