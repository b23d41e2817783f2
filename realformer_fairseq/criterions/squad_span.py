"""SQuAD span loss of google-research/bert ``run_squad.py`` (``model_fn``'s ``compute_loss``):
the mean of the start and end cross-entropies over the sequence, used by RealFormer (He et al.
2020, arXiv 2012.11747) to fine-tune on SQuAD.

fairseq divides the summed loss by ``sample_size`` (the windows of the batch), so the gradient
is run_squad.py's batch mean. Logged: ``loss`` (base 2, as fairseq's sentence_prediction logs
it) and the share of windows whose arg-max start / end is the label (``start_acc``,
``end_acc``).
"""

import math

import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..errors import RealformerConfigError


@register_criterion("squad_span", dataclass=FairseqDataclass)
class SquadSpanCriterion(FairseqCriterion):
    def forward(self, model, sample, reduce=True):
        head = self.task.cfg.span_head_name
        (start_logits, end_logits), _ = model(**sample["net_input"], span_head_name=head)
        target = sample["target"]
        if bool((target < 0).any()):
            raise RealformerConfigError(
                "this subset has no answer labels (prepared for prediction, as run_squad.py "
                "prepares dev files): train on a training file, and validate with "
                "--disable-validation or on a labelled subset"
            )
        start_loss = F.cross_entropy(start_logits.float(), target[:, 0], reduction="sum")
        end_loss = F.cross_entropy(end_logits.float(), target[:, 1], reduction="sum")
        loss = (start_loss + end_loss) / 2
        sample_size = target.size(0)
        logging_output = {
            "loss": loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample_size,
            "sample_size": sample_size,
            "start_correct": (start_logits.argmax(-1) == target[:, 0]).sum().data,
            "end_correct": (end_logits.argmax(-1) == target[:, 1]).sum().data,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / sample_size / math.log(2), sample_size, round=3)
        for key in ("start", "end"):
            correct = sum(log.get(f"{key}_correct", 0) for log in logging_outputs)
            metrics.log_scalar(f"{key}_acc", 100.0 * correct / sample_size, sample_size, round=1)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
