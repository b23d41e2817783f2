"""fairseq checkpoints as the pipelines read them: a checkpoint loaded with the plugin's models
registered, and the model flags a ``fairseq-train`` command must repeat to build the same model
again (fine-tuning a pre-trained encoder: examples/glue, examples/squad). Importing this module
imports neither fairseq nor the plugin; its functions do, when called."""

import argparse
import os
from typing import List, Optional, Sequence, Tuple

from .errors import InputError
from .startup import heavy_imports


def load_checkpoint(path: str, arg_overrides: Optional[dict] = None) -> dict:
    """fairseq's checkpoint, its config updated with ``arg_overrides`` (fairseq applies them here
    only: ``load_model_ensemble_and_task(state=...)`` does not), read by the plugin's one reader
    (:func:`realformer_fairseq.checkpoint_compat.read_checkpoint`: a missing, unreadable or
    corrupt file, one that is no fairseq checkpoint and an unregistered --arch are an
    :class:`InputError`; anything else keeps its traceback)."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: missing checkpoint file")
    import logging

    # importing fairseq logs "Please install tensorboardX" (its speech task) at INFO
    logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
    with heavy_imports():
        from realformer_fairseq.checkpoint_compat import read_checkpoint

    return read_checkpoint(path, arg_overrides)


def cfg_get(cfg, key, default=None):
    """``cfg[key]`` of a checkpoint's config section, a dict or an omegaconf/Namespace object."""
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


# model arguments that are outputs or paths of the pre-training run, never carried over
NOT_CARRIED = ("admin_profile_out", "data", "_name", "arch")


def model_flags(checkpoint: dict, drop: Sequence[str]) -> Tuple[str, List[str], dict]:
    """(arch, flags, facts) of a pre-trained encoder-only checkpoint: every model argument of
    its registered model whose value differs from the arch's default (what fairseq-train must be
    given to build the same model again; a same-shape model that computes otherwise, e.g.
    another --residual-attention-mode, would load without complaint), except the ``drop``
    ones; facts: max_positions, type_vocab_size."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.models.roberta.model import RobertaModel

    model_cfg = checkpoint["cfg"]["model"]
    arch = cfg_get(model_cfg, "arch") or cfg_get(model_cfg, "_name")
    if arch not in ARCH_MODEL_REGISTRY:
        raise InputError(f"the checkpoint's --arch '{arch}' is not registered (plugin missing?)")
    model_cls = ARCH_MODEL_REGISTRY[arch]
    if not issubclass(model_cls, RobertaModel):
        raise InputError(
            f"--arch {arch} is not an encoder-only model (RoBERTa/BERT): GLUE fine-tuning needs "
            "a masked_lm checkpoint of realformer_roberta (realformer_bert_*, postln_bert_*, ...)"
        )
    # fairseq's parse_args_and_arch: model arguments without a default are absent
    # (argument_default=SUPPRESS), then the arch function fills them in
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    defaults = parser.parse_args([])
    ARCH_CONFIG_REGISTRY[arch](defaults)
    # then the model's base architecture, as its build_model applies it (the arch named after
    # the model: realformer_roberta, roberta)
    for name, cls in MODEL_REGISTRY.items():
        if cls is model_cls and name in ARCH_CONFIG_REGISTRY:
            ARCH_CONFIG_REGISTRY[name](defaults)
    flags = []
    for action in parser._actions:
        dest = action.dest
        if not action.option_strings or dest in NOT_CARRIED or dest in drop:
            continue
        if isinstance(model_cfg, dict) and dest not in model_cfg:
            continue
        if not isinstance(model_cfg, dict) and not hasattr(model_cfg, dest):
            continue
        value, default = cfg_get(model_cfg, dest), getattr(defaults, dest, None)
        if value == default or (value is None and default in (False, "")):
            continue
        option = max(action.option_strings, key=len)
        if isinstance(action, argparse._StoreTrueAction):
            if not value:
                raise InputError(f"the checkpoint has {option} off, which its --arch {arch} "
                                 "turns on: no flag can say so")  # fmt: skip
            flags.append(option)
        elif isinstance(action, argparse._StoreFalseAction):
            if value:
                raise InputError(f"the checkpoint has {option} on; no flag can say so")
            flags.append(option)
        else:
            flags += [option, str(value)]
    facts = {
        "max_positions": cfg_get(model_cfg, "max_positions"),
        "type_vocab_size": int(cfg_get(model_cfg, "type_vocab_size", 0) or 0),
    }
    return arch, flags, facts
