"""Span heads (SQuAD start / end logits) on the encoder-only model, kept like fairseq's
classification heads.

fairseq's ``RobertaModel`` keeps its sentence-level heads in ``classification_heads`` and
restores them in ``upgrade_state_dict_named`` (fairseq 0.12.3): a head the checkpoint lacks
starts from the model's fresh values, a checkpoint head the model lacks is registered when
``load_checkpoint_heads`` is set (the hub) and dropped with a warning otherwise. The mixin
below does the same for ``span_heads`` (:class:`~realformer_fairseq.modules.span_head.SpanHead`,
BERT's SQuAD layer), which the ``squad`` task registers; ``forward(...,
span_head_name=NAME)`` returns ``((start, end), extra)`` from inside the model's forward (so
that DistributedDataParallel sees the head). A model without span heads has the same state
dict as before.
"""

import logging

from torch import nn

from ..errors import RealformerConfigError
from ..modules.span_head import SpanHead

logger = logging.getLogger(__name__)

SPAN_HEADS = "span_heads."


class SpanHeadMixin:
    """For a fairseq ``RobertaModel`` subclass (listed before it in the bases)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.span_heads = nn.ModuleDict()

    def register_span_head(self, name: str):
        """A new :class:`SpanHead` ``name`` (fresh, BERT's initialisation)."""
        if name in self.span_heads:
            logger.info("re-registering span head '%s'", name)
        self.span_heads[name] = SpanHead(self.args.encoder_embed_dim)

    def forward(self, src_tokens, features_only=False, return_all_hiddens=False,
                classification_head_name=None, span_head_name=None, **kwargs):  # fmt: skip
        if span_head_name is None:
            return super().forward(src_tokens, features_only=features_only,
                                   return_all_hiddens=return_all_hiddens,
                                   classification_head_name=classification_head_name, **kwargs)  # fmt: skip
        if classification_head_name is not None:
            raise RealformerConfigError("give a classification head or a span head, not both")
        if span_head_name not in self.span_heads:
            raise RealformerConfigError(
                f"the model has no span head '{span_head_name}' (has: "
                f"{', '.join(self.span_heads) or 'none'})"
            )
        features, extra = super().forward(src_tokens, features_only=True,
                                          return_all_hiddens=return_all_hiddens, **kwargs)  # fmt: skip
        padding_mask = src_tokens.eq(self.encoder.sentence_encoder.padding_idx)
        return self.span_heads[span_head_name](features, padding_mask), extra

    def upgrade_state_dict_named(self, state_dict, name):
        """fairseq's, then span heads as fairseq 0.12.3 treats classification heads (see the
        module docstring)."""
        super().upgrade_state_dict_named(state_dict, name)
        prefix = (name + "." if name != "" else "") + SPAN_HEADS
        in_checkpoint = {k[len(prefix) :].split(".")[0] for k in state_dict if k.startswith(prefix)}
        for head in sorted(in_checkpoint - set(self.span_heads)):
            if getattr(self.args, "load_checkpoint_heads", False):
                self.register_span_head(head)
            else:
                logger.warning("deleting span head (%s) from checkpoint not present in current "
                               "model", head)  # fmt: skip
                for k in [k for k in state_dict if k.startswith(prefix + head + ".")]:
                    del state_dict[k]
        for k, v in self.span_heads.state_dict().items():
            if prefix + k not in state_dict:
                logger.info("span head %s: new (not in the checkpoint), BERT's initialisation", k)
                state_dict[prefix + k] = v
