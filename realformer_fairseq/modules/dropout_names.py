"""``--retain-dropout-modules`` for the plugin's subclasses of fairseq's modules.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747). The
plugin's encoder, decoder, layers and residual attention subclass fairseq's, and fairseq names
each ``FairseqDropout`` after the class that owns it, so the plugin's dropouts carry the
plugin's class names (``RealformerEncoderLayer``, ...). ``--retain-dropout
--retain-dropout-modules VALUE`` (Monte-Carlo dropout at inference) compares those names with
VALUE, where fairseq's documented names (``TransformerEncoder``, ...) would match none of them
and dropout would stay off without a word. Here VALUE selects, on the plugin's models:

* every dropout that fairseq 0.12.3 selects for the same VALUE on its own model (``transformer``,
  ``transformer_lm``, ``roberta``), in the same place: the owner's fairseq name (the class
  fairseq's model builds there, :data:`FAIRSEQ_BUILT_CLASSES`) tested as fairseq tests it;
* and the dropout of every module whose class (fairseq's or the plugin's) VALUE names.

fairseq tests ``module_name in VALUE``. From the command line (``fairseq-generate``,
``fairseq-interactive``) VALUE is a *string*, since fairseq's ``GenerationConfig`` declares the
field ``Any``: ``TransformerEncoder``, ``TransformerEncoder,TransformerDecoder`` or the Python
list ``"['TransformerEncoder','TransformerDecoder']"`` all work in fairseq, as a test of one text
inside another. So a name is also selected where it only appears *inside* a longer one
(``TransformerEncoderLayerBase`` keeps ``TransformerEncoder``'s dropout on too): the plugin's
models do the same as fairseq's, and say so in one warning line. From Python (the hub's
``retain_dropout_modules=[...]``) VALUE is a list and fairseq tests membership; so does the
plugin. A name that selects nothing is one warning line.

fairseq 0.12.3's own ``transformer`` builds ``TransformerEncoderLayerBase`` layers, so its
documented ``TransformerEncoderLayer`` selects none of its own layers (tested); for the
plugin's layers both names work.
"""

import logging
import re
from typing import Dict, Iterable, List, NamedTuple, Optional, Set, Tuple, Union

from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import nn

logger = logging.getLogger(__name__)

# The classes fairseq 0.12.3's own models build where the plugin builds its subclasses; a
# FairseqDropout in fairseq's model is named after one of them (tested against fairseq's
# transformer): TransformerModel (transformer_legacy), TransformerLanguageModel and
# RobertaModel build the legacy TransformerEncoder / TransformerDecoder, whose layers are
# the *Base classes.
FAIRSEQ_BUILT_CLASSES = (
    "TransformerEncoder",
    "TransformerDecoder",
    "TransformerEncoderLayerBase",
    "TransformerDecoderLayerBase",
    "MultiheadAttention",
)


def _class_names(module: nn.Module) -> Set[str]:
    """The names of the fairseq and plugin classes ``module`` is an instance of."""
    return {
        cls.__name__
        for cls in type(module).__mro__
        if cls.__module__.startswith(("fairseq.", "realformer_fairseq."))
    }


def fairseq_dropout_name(module: nn.Module, dropout: FairseqDropout) -> Optional[str]:
    """The ``module_name`` fairseq's own model gives the dropout that ``module`` owns: its own
    where ``module`` is fairseq's class, else the first of :data:`FAIRSEQ_BUILT_CLASSES` that
    ``module``'s class derives from (None for a module fairseq's models do not have)."""
    if type(module).__module__.startswith("fairseq."):
        return dropout.module_name
    for cls in type(module).__mro__:
        if cls.__module__.startswith("fairseq.") and cls.__name__ in FAIRSEQ_BUILT_CLASSES:
            return cls.__name__
    return None


def _owned_dropouts(model: nn.Module) -> List[Tuple[nn.Module, FairseqDropout]]:
    """(owner, dropout) for every named ``FairseqDropout`` owned directly by a module."""
    return [
        (module, child)
        for module in model.modules()
        for child in module.children()
        if isinstance(child, FairseqDropout) and child.module_name
    ]


def _dropout_names_by_class(model: nn.Module) -> Dict[str, Set[str]]:
    """class name -> the ``module_name`` of every ``FairseqDropout`` owned directly by a
    module of that class (or a subclass)."""
    selected: Dict[str, Set[str]] = {}
    for module, dropout in _owned_dropouts(model):
        for name in _class_names(module) | {dropout.module_name}:
            selected.setdefault(name, set()).add(dropout.module_name)
    return selected


class RetainedDropout(NamedTuple):
    """What ``--retain-dropout-modules`` selects on one model."""

    module_names: List[str]  # the FairseqDropout module names to keep on (fairseq's list form)
    unknown: List[str]  # requested names that select nothing
    # fairseq names selected only because they appear inside a longer requested name
    inside_longer_names: List[str]


def requested_names(requested: Union[str, Iterable[str]]) -> List[str]:
    """The names in a ``--retain-dropout-modules`` value: a string's words (any spelling:
    ``A``, ``A,B``, ``A B``, ``['A','B']``), or a list's items."""
    if isinstance(requested, str):
        return re.findall(r"[A-Za-z_]\w*", requested)
    return [str(name) for name in requested]


def retained_dropout_names(
    model: nn.Module, requested: Union[str, Iterable[str]]
) -> RetainedDropout:
    """``--retain-dropout-modules`` for ``model`` (see the module docstring): a string as
    fairseq's ``FairseqDropout`` reads it (``name in text``), a list by membership, plus the
    modules whose class is named."""
    names = requested_names(requested)
    if isinstance(requested, str):
        fairseq_selects = lambda name: name in requested  # noqa: E731  (FairseqDropout's test)
    else:
        fairseq_selects = lambda name: name in names  # noqa: E731
    selected: Set[str] = set()
    matched: Set[str] = set()
    inside: Set[str] = set()
    for module, dropout in _owned_dropouts(model):
        fairseq_name = fairseq_dropout_name(module, dropout)
        by_class = (_class_names(module) | {dropout.module_name}) & set(names)
        matched |= by_class
        if fairseq_name is not None and fairseq_selects(fairseq_name):
            selected.add(dropout.module_name)
            if fairseq_name not in names:
                inside.add(fairseq_name)
        if by_class:
            selected.add(dropout.module_name)
    unknown = [name for name in names if name not in matched]
    return RetainedDropout(sorted(selected), unknown, sorted(inside))


class RetainDropoutNamesMixin:
    """For the plugin's models: fairseq's ``make_generation_fast_`` (what
    ``prepare_for_inference_``, ``fairseq-generate --retain-dropout`` and the hub call) with
    ``retain_dropout_modules`` resolved by :func:`retained_dropout_names`."""

    def make_generation_fast_(self, **kwargs):
        requested = kwargs.get("retain_dropout_modules")
        if kwargs.get("retain_dropout") and requested is not None:
            retained = retained_dropout_names(self, requested)
            if retained.unknown:
                logger.warning(
                    "--retain-dropout-modules %s: no module of this model has that name "
                    "(modules with dropout here: %s); it keeps no dropout on",
                    " ".join(retained.unknown),
                    ", ".join(sorted(_dropout_names_by_class(self))),
                )
            if retained.inside_longer_names:
                logger.warning(
                    "--retain-dropout-modules %r: fairseq finds module names anywhere inside "
                    "this text, so the dropout of %s stays on too, as on fairseq's own models",
                    requested,
                    ", ".join(retained.inside_longer_names),
                )
            kwargs["retain_dropout_modules"] = retained.module_names
        super().make_generation_fast_(**kwargs)
