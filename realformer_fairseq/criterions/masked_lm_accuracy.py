"""Masked-LM loss that also reports MLM accuracy, the headline metric of
RealFormer's BERT experiments (He et al. 2020, arXiv 2012.11747, Table 1).

fairseq's ``masked_lm`` criterion logs only the loss.
"""

import torch
from fairseq import modules
from fairseq.criterions import register_criterion
from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss
from fairseq.logging import metrics


@register_criterion("masked_lm_accuracy", dataclass=MaskedLmConfig)
class MaskedLmAccuracyLoss(MaskedLmLoss):
    """fairseq's ``masked_lm`` loss, plus ``accuracy``: the percentage of masked
    tokens whose arg-max prediction is the original token."""

    def forward(self, model, sample, reduce=True):
        """Mirrors fairseq 0.12.3 ``MaskedLmLoss.forward``; adds ``n_correct``."""
        masked_tokens = sample["target"].ne(self.padding_idx)  # (bsz, seq_len)
        sample_size = masked_tokens.int().sum()
        if self.tpu:
            masked_tokens = None  # always project all tokens on TPU
        elif masked_tokens.device == torch.device("cpu"):
            if not masked_tokens.any():
                masked_tokens = None
        else:
            masked_tokens = torch.where(
                masked_tokens.any(), masked_tokens, masked_tokens.new([True])
            )

        logits = model(**sample["net_input"], masked_tokens=masked_tokens)[0]  # (n_masked, vocab)
        targets = model.get_targets(sample, [logits])
        if masked_tokens is not None:
            targets = targets[masked_tokens]
        targets = targets.view(-1)
        loss = modules.cross_entropy(
            logits.view(-1, logits.size(-1)),
            targets,
            reduction="sum",
            ignore_index=self.padding_idx,
        )
        predictable = targets.ne(self.padding_idx)
        n_correct = (logits.view(-1, logits.size(-1)).argmax(-1).eq(targets) & predictable).sum()
        logging_output = {
            "loss": loss if self.tpu else loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["nsentences"],
            "sample_size": sample_size,
            "n_correct": n_correct if self.tpu else n_correct.data,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        MaskedLmLoss.reduce_metrics(logging_outputs)
        n_correct = sum(log.get("n_correct", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        if sample_size > 0:
            metrics.log_scalar(
                "accuracy", 100.0 * float(n_correct) / float(sample_size), sample_size, round=2
            )
