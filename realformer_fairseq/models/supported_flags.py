"""fairseq transformer flags that the RealFormer models refuse at start-up.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(arXiv 2012.11747). The encoder and decoder re-own fairseq's layer loops to pass
the residual score streams from layer to layer; a fairseq flag that those loops
or the residual attention module do not carry out is refused here, with one
line, rather than silently dropped. Every other flag of fairseq's ``transformer``
works as in fairseq; the audit (flag, result, test) is in docs/guarantees.md.
"""

from fairseq import utils
from omegaconf import ListConfig

from ..errors import RealformerConfigError
from ..settings import RealformerSettings

# fairseq 0.12.3's NormFormer flags (Shleifer et al. 2021), read by its decoder layer only
NORMFORMER_FLAGS = ("scale_attn", "scale_fc", "scale_heads", "scale_resids")


def refuse_unsupported_flags(args, settings: RealformerSettings, model_chains):
    """Raise RealformerConfigError for a fairseq flag the model would not carry out.

    ``settings``: the plugin's settings read from ``args``; ``model_chains``: the score
    chains the model has (``("encoder",)`` for the encoder-only model, whose decoder flags
    fairseq ignores anyway).
    """
    has_decoder = "decoder" in model_chains
    if has_decoder:
        for flag in NORMFORMER_FLAGS:
            if utils.safe_getattr(args, flag, False):
                raise RealformerConfigError(
                    f"--{flag.replace('_', '-')} (NormFormer) is not supported: the RealFormer "
                    "decoder layer re-owns fairseq's layer forward without NormFormer's extra "
                    "LayerNorms and scales"
                )
    for side in ("encoder", "decoder"):
        keep = utils.safe_getattr(args, f"{side}_layers_to_keep", None)
        if isinstance(keep, (list, tuple, ListConfig)):
            # fairseq 0.12's transformer parses the flag (or takes a hydra config's list)
            # as a list, then calls .split(",") on it (AttributeError); RoBERTa's parser
            # keeps the string
            raise RealformerConfigError(
                f"--{side}-layers-to-keep as a list (command line or config) crashes fairseq "
                "0.12's transformer; prune a trained model with --model-overrides "
                f"\"{{'{side}_layers_to_keep': '0,2,4'}}\" instead"
            )
    keep = [
        utils.safe_getattr(args, f"{side}_layers_to_keep", None) for side in ("encoder", "decoder")
    ]
    if has_decoder and bool(keep[0]) != bool(keep[1]):
        # fairseq 0.12's prune_state_dict keeps only the layers its pruning passes
        # map: with one side given, every layer of the other side is dropped
        given, other = ("encoder", "decoder") if keep[0] else ("decoder", "encoder")
        raise RealformerConfigError(
            f"{given}_layers_to_keep without {other}_layers_to_keep: fairseq 0.12 would drop "
            f"every {other} layer of the checkpoint; list the {other} layers to keep too "
            "(all of them: '0,1,...')"
        )
    if has_decoder and utils.safe_getattr(args, "cross_self_attention", False):
        raise RealformerConfigError(
            "--cross-self-attention is not supported: the decoder's layer loop does not "
            "attend to the encoder output from self-attention (and its score stream would "
            "mix source and target keys)"
        )
    if has_decoder and (utils.safe_getattr(args, "base_layers", 0) or 0) > 0:
        raise RealformerConfigError(
            "--base-layers is not supported: BASE layers do not take or return the "
            "residual attention score streams"
        )
    if (
        has_decoder
        and utils.safe_getattr(args, "tie_adaptive_weights", False)
        and utils.safe_getattr(args, "adaptive_softmax_cutoff", None)
        # the language model builds adaptive input embeddings (--adaptive-input)
        and not utils.safe_getattr(args, "adaptive_input", False)
    ):
        raise RealformerConfigError(
            "--tie-adaptive-weights with --adaptive-softmax-cutoff needs adaptive input "
            "embeddings, which the translation transformer never builds (fairseq's "
            "transformer fails here too)"
        )
    chains = settings.residual_chains
    # fairseq's layers give --encoder-xformers-att-config to the encoder self-attention
    # and the decoder cross-attention, --decoder-xformers-att-config to the decoder
    # self-attention
    for side, side_chains in (("encoder", {"encoder", "cross"}), ("decoder", {"decoder"})):
        if chains & side_chains and utils.safe_getattr(args, f"{side}_xformers_att_config", None):
            raise RealformerConfigError(
                f"--{side}-xformers-att-config is not supported with residual attention on "
                f"({', '.join(sorted(chains & side_chains))}): the residual attention "
                "computes its scores itself"
            )


def refuse_unsupported_task(task):
    """Raise RealformerConfigError for a fairseq task the translation model cannot serve."""
    from fairseq.tasks.multilingual_translation import MultilingualTranslationTask

    if isinstance(task, MultilingualTranslationTask):
        raise RealformerConfigError(
            "--task multilingual_translation needs a FairseqMultiModel (one encoder-decoder "
            "per language pair, fairseq's multilingual_transformer); the plugin's "
            "realformer_transformer is a single encoder-decoder model"
        )
