"""One-line errors for a checkpoint loaded into a model it does not fit."""

import argparse
import logging
from typing import Optional

from fairseq import utils
from fairseq.checkpoint_utils import prune_state_dict

from ..errors import RealformerConfigError, one_line_under_fairseq_commands

logger = logging.getLogger(__name__)

_ARCH_KEY = "realformer_arch"
_LAYERS_TO_KEEP = ("encoder_layers_to_keep", "decoder_layers_to_keep")


def _record_arch(module, state_dict, prefix, local_metadata):
    """State-dict hook: keep the model's --arch in the state dict's metadata
    (saved with it), so that a mismatching load can name it."""
    local_metadata[_ARCH_KEY] = utils.safe_getattr(module.args, "arch", None)


def _state_dict_mismatch(model, state_dict, ckpt_arch: Optional[str]) -> str:
    """One line: which archs, and the first key of each kind of mismatch."""
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    shapes = [
        f"{k} {tuple(state_dict[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in state_dict and getattr(state_dict[k], "shape", v.shape) != v.shape
    ]
    problems = [
        f"{len(keys)} {what} (e.g. {keys[0]})"
        for what, keys in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatches, checkpoint vs model", shapes),
        )
        if keys
    ]
    arch = utils.safe_getattr(model.args, "arch", "unknown")
    other_flags = " with other flags" if ckpt_arch == arch else ""
    return (
        f"the checkpoint (--arch {ckpt_arch or 'unknown'}) does not fit this model "
        f"(--arch {arch}{other_flags}): " + "; ".join(problems)
    )


class ArchCheckedLoadMixin:
    """For fairseq models: record ``--arch`` in the state dict's metadata and turn
    a mismatching ``load_state_dict`` into one error line naming both archs."""

    def register_arch_check(self):
        self._register_state_dict_hook(_record_arch)

    @one_line_under_fairseq_commands
    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's ``load_state_dict``; a checkpoint of another architecture is
        one error line naming both archs, instead of torch's key list under
        fairseq's "Cannot load model parameters" stack trace."""
        ckpt_arch = (getattr(state_dict, "_metadata", None) or {}).get("", {}).get(_ARCH_KEY)
        # fairseq's load prunes the state dict by *_layers_to_keep and then clears them
        # in model_cfg: keep them to name the keys that were actually compared
        layers_to_keep = {k: utils.safe_getattr(model_cfg, k, None) for k in _LAYERS_TO_KEEP}
        try:
            result = super().load_state_dict(
                state_dict, strict=strict, model_cfg=model_cfg, args=args
            )
        except RuntimeError as err:
            if not strict or "Error(s) in loading state_dict" not in str(err):
                raise
            if any(layers_to_keep.values()):
                pruning = argparse.Namespace(arch=ckpt_arch or "unknown", **layers_to_keep)
                state_dict = prune_state_dict(state_dict, pruning)
            raise RealformerConfigError(_state_dict_mismatch(self, state_dict, ckpt_arch)) from None
        arch = utils.safe_getattr(self.args, "arch", None)
        if ckpt_arch is not None and ckpt_arch != arch:
            logger.warning(
                "loaded a checkpoint trained with --arch %s into --arch %s (the parameters fit)",
                ckpt_arch,
                arch,
            )
        return result
