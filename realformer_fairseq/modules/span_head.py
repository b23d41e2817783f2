"""BERT's SQuAD output layer (google-research/bert ``run_squad.py`` ``create_model``), used by
RealFormer (He et al. 2020, arXiv 2012.11747) for its SQuAD results.

One linear layer from the final hidden states to two logits per position, start and end
(``cls/squad/output_weights`` [2, D], truncated normal stddev 0.02, ``cls/squad/output_bias``
zeros), with no dropout or activation of its own. A no-answer (SQuAD v2.0) is the span
``[CLS] .. [CLS]``, position 0. Padding positions get ``-inf`` (run_squad.py pads every
sequence to ``max_seq_length`` and lets its padding into the softmax; fairseq batches are
padded to their longest sequence, so padding is left out to make the loss independent of the
batch).
"""

from torch import Tensor, nn

BERT_INITIALIZER_RANGE = 0.02  # run_squad.py create_model: truncated_normal_initializer(0.02)


class SpanHead(nn.Module):
    """Start and end logits over the sequence: ``(start, end)``, each batch x length."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.out_proj = nn.Linear(embed_dim, 2)
        # TF's truncated normal redraws values beyond two standard deviations
        nn.init.trunc_normal_(
            self.out_proj.weight,
            std=BERT_INITIALIZER_RANGE,
            a=-2 * BERT_INITIALIZER_RANGE,
            b=2 * BERT_INITIALIZER_RANGE,
        )
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, features: Tensor, padding_mask: Tensor = None):
        logits = self.out_proj(features)
        start, end = logits[..., 0], logits[..., 1]
        if padding_mask is not None and padding_mask.any():
            start = start.masked_fill(padding_mask, float("-inf"))
            end = end.masked_fill(padding_mask, float("-inf"))
        return start, end
