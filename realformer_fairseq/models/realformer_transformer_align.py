"""RealFormer encoder-decoder with alignment supervision, as fairseq's ``transformer_align``.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(arXiv 2012.11747), on ADMIN-initialised transformers (Liu et al., arXiv 2004.08249);
alignment supervision as in Garg, Peitz, Nallasamy, Paulik. "Jointly Learning to Align and
Translate with Transformer Models" (EMNLP 2019, arXiv 1909.02074): the mean of the first
``--alignment-heads`` cross-attention heads of decoder layer ``--alignment-layer`` is trained
towards given word alignments (``fairseq-train --load-alignments --criterion
label_smoothed_cross_entropy_with_alignment``) and printed by ``fairseq-generate
--print-alignment``.

With residual attention on the cross chain, the supervised distribution is the residual
softmax the layer used (softmax of the running sum or mean of the cross-attention scores).
"""

import contextlib

from fairseq.models import register_model
from omegaconf import OmegaConf, open_dict

from ..errors import RealformerConfigError, one_line_under_fairseq_commands
from .architectures import register_family_architectures, register_family_base_architecture
from .build_checks import arch_label
from .realformer_transformer import RealformerTransformerModel


def add_alignment_args(parser):
    """fairseq 0.12.3 ``TransformerAlignModel.add_args``' own three flags."""
    # fmt: off
    parser.add_argument('--alignment-heads', type=int, metavar='D',
                        help='Number of cross attention heads per layer to supervised with alignments')
    parser.add_argument('--alignment-layer', type=int, metavar='D',
                        help='Layer number which has to be supervised. 0 corresponding to the bottommost layer.')
    parser.add_argument('--full-context-alignment', action='store_true',
                        help='Whether or not alignment is supervised conditioned on the full target context.')
    # fmt: on


def check_alignment_args(args, model_name: str):
    """Refuse an alignment layer or head count the decoder does not have: fairseq's
    ``transformer_align`` then supervises nothing (its criterion fails on a missing
    attention, or slices past the last head without a word)."""
    layer, heads = args.alignment_layer, args.alignment_heads
    layers, decoder_heads = args.decoder_layers, args.decoder_attention_heads
    if layer is None or not 0 <= layer < layers:
        raise RealformerConfigError(
            f"--alignment-layer {layer} is not a decoder layer of {model_name} "
            f"(layers 0..{layers - 1}): no cross-attention would be supervised"
        )
    if heads is None or not 1 <= heads <= decoder_heads:
        raise RealformerConfigError(
            f"--alignment-heads {heads} is not a number of heads of {model_name} "
            f"(1..{decoder_heads} decoder attention heads)"
        )


@register_model("realformer_transformer_align")
class RealformerTransformerAlignModel(RealformerTransformerModel):
    """:class:`RealformerTransformerModel` with fairseq 0.12.3 ``TransformerAlignModel``'s
    forward: the decoder returns the alignment attention of ``--alignment-layer``
    (``--alignment-heads``), computed again without the future mask when
    ``--full-context-alignment`` is set."""

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        self.alignment_heads = args.alignment_heads
        self.alignment_layer = args.alignment_layer
        self.full_context_alignment = args.full_context_alignment

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_alignment_args(parser)

    @classmethod
    @one_line_under_fairseq_commands
    def build_model(cls, args, task):
        with open_dict(args) if OmegaConf.is_config(args) else contextlib.nullcontext():
            realformer_align_base_architecture(args)
        check_alignment_args(args, arch_label(args, "realformer_transformer_align"))
        return super().build_model(args, task)

    def forward(self, src_tokens, src_lengths, prev_output_tokens):
        """Mirrors fairseq 0.12.3 ``TransformerAlignModel.forward``, with ADMIN profiling on
        the first training batch first."""
        self.profile_admin_if_needed(src_tokens, src_lengths, prev_output_tokens)
        encoder_out = self.encoder(src_tokens, src_lengths)
        return self.forward_decoder(prev_output_tokens, encoder_out)

    def forward_decoder(
        self,
        prev_output_tokens,
        encoder_out=None,
        incremental_state=None,
        features_only=False,
        **extra_args,
    ):
        """Mirrors fairseq 0.12.3 ``TransformerAlignModel.forward_decoder``. The ADMIN
        profiling forward skips the full-context pass: it would run every decoder sublayer a
        second time and profile omega on the continued ratio chain."""
        attn_args = {
            "alignment_layer": self.alignment_layer,
            "alignment_heads": self.alignment_heads,
        }
        decoder_out = self.decoder(prev_output_tokens, encoder_out, **attn_args)

        if self.full_context_alignment and not getattr(self, "_admin_profiling_now", False):
            attn_args["full_context_alignment"] = self.full_context_alignment
            _, alignment_out = self.decoder(
                prev_output_tokens,
                encoder_out,
                features_only=True,
                **attn_args,
                **extra_args,
            )
            decoder_out[1]["attn"] = alignment_out["attn"]

        return decoder_out


# Architectures: every default is in models/architectures.py (FAMILIES).

realformer_align_base_architecture = register_family_base_architecture(
    "realformer_transformer_align"
)

ARCHITECTURES = register_family_architectures("realformer_transformer_align")
