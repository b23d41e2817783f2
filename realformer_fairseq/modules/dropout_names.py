"""``--retain-dropout-modules`` for the plugin's subclasses of fairseq's modules.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747). The
plugin's encoder, decoder, layers and residual attention subclass fairseq's. fairseq names
each ``FairseqDropout`` after the class that owns it and ``--retain-dropout
--retain-dropout-modules NAME ...`` (Monte-Carlo dropout at inference) compares those
names with NAME: fairseq's documented names (``TransformerEncoder``, ``TransformerDecoder``,
``TransformerEncoderLayer``, ...) would match none of the plugin's modules, and dropout would
stay off without a word. Here a NAME selects the dropout of every module that is an instance
of a class of that name (fairseq's or the plugin's), and a NAME that selects nothing is one
warning line.

fairseq 0.12.3's own ``transformer`` builds ``TransformerEncoderLayerBase`` layers, so its
documented ``TransformerEncoderLayer`` selects none of its own layers (tested); for the
plugin's layers both names work.
"""

import logging
from typing import Dict, Iterable, List, Set, Tuple

from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import nn

logger = logging.getLogger(__name__)


def _class_names(module: nn.Module) -> Set[str]:
    """The names of the fairseq and plugin classes ``module`` is an instance of."""
    return {
        cls.__name__
        for cls in type(module).__mro__
        if cls.__module__.startswith(("fairseq.", "realformer_fairseq."))
    }


def _dropout_names_by_class(model: nn.Module) -> Dict[str, Set[str]]:
    """class name -> the ``module_name`` of every ``FairseqDropout`` owned directly by a
    module of that class (or a subclass)."""
    selected: Dict[str, Set[str]] = {}
    for module in model.modules():
        for child in module.children():
            if isinstance(child, FairseqDropout) and child.module_name:
                for name in _class_names(module) | {child.module_name}:
                    selected.setdefault(name, set()).add(child.module_name)
    return selected


def retained_dropout_names(
    model: nn.Module, requested: Iterable[str]
) -> Tuple[List[str], List[str]]:
    """``--retain-dropout-modules`` for ``model``: the ``FairseqDropout`` module names that
    ``requested`` selects, and the requested names that select nothing."""
    selected = _dropout_names_by_class(model)
    names: Set[str] = set()
    unknown = []
    for name in requested:
        if name in selected:
            names |= selected[name]
        else:
            unknown.append(name)
    return sorted(names), unknown


class RetainDropoutNamesMixin:
    """For the plugin's models: fairseq's ``make_generation_fast_`` (what
    ``prepare_for_inference_``, ``fairseq-generate --retain-dropout`` and the hub call) with
    ``retain_dropout_modules`` resolved by :func:`retained_dropout_names`."""

    def make_generation_fast_(self, **kwargs):
        requested = kwargs.get("retain_dropout_modules")
        if kwargs.get("retain_dropout") and requested is not None:
            names, unknown = retained_dropout_names(self, requested)
            if unknown:
                logger.warning(
                    "--retain-dropout-modules %s: no module of this model has that name "
                    "(modules with dropout here: %s); it keeps no dropout on",
                    " ".join(unknown),
                    ", ".join(sorted(_dropout_names_by_class(self))),
                )
            kwargs["retain_dropout_modules"] = names
        super().make_generation_fast_(**kwargs)
