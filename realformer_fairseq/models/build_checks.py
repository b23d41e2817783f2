"""What every model's ``build_model`` checks, before and after building.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(arXiv 2012.11747); Liu et al. "Understanding the Difficulty of Training Transformers"
(arXiv 2004.08249). Before building, :func:`settings_for_build` reads the plugin's settings
(the settings module's one reading function) and refuses fairseq flags the model would not
carry out; after building, :func:`check_layers_match_settings` refuses a model whose modules
do not do what its settings ask (a build path that dropped a flag) and logs one line counted
from the modules.
"""

import logging
from typing import Dict, Iterable, Optional, Sequence

from fairseq import utils
from torch import nn

from ..errors import RealformerConfigError
from ..modules.admin import AdminResidual
from ..modules.routes import ROUTES, RealformerMultiheadAttention
from ..modules.routes.rules import built_route
from ..settings import RealformerSettings, read_realformer_settings
from .supported_flags import refuse_unsupported_flags

logger = logging.getLogger(__name__)


def arch_label(args, model_name: str) -> str:
    """``--arch NAME`` for messages: ``args.arch``, the ``_name`` of a hydra model config, or
    the registered model's name when the config names neither (a ``Namespace`` built by hand)."""
    arch = utils.safe_getattr(args, "arch", None) or utils.safe_getattr(args, "_name", None)
    return f"--arch {arch or model_name}"


def settings_for_build(
    args, model_chains: Sequence[str], model_name: str, bert_options: bool = False
) -> RealformerSettings:
    """The settings of a model with the chains ``model_chains``, read from ``args`` after the
    architecture's defaults; fairseq flags that the model would not carry out are refused.
    ``model_name`` names the model in the messages; ``bert_options``: the model carries out
    the BERT options. Raises :class:`RealformerConfigError`."""
    settings = read_realformer_settings(
        args, model_chains=model_chains, model_name=model_name, bert_options=bert_options
    )
    refuse_unsupported_flags(args, settings, model_chains)
    return settings


def check_layers_match_settings(
    settings: RealformerSettings,
    chain_attention: Dict[str, Iterable[Optional[nn.Module]]],
    model: nn.Module,
    model_name: str = "the model",
):
    """Refuse a built model that does not do what ``settings`` asks.

    ``chain_attention`` maps each chain the model has to its attention modules, one
    per layer (``None`` where a layer has none, e.g. no cross-attention). Every module
    of a residual chain must be a :class:`RealformerMultiheadAttention` with the
    requested mode and route (``--residual-attention-impl`` as
    :func:`~realformer_fairseq.modules.routes.rules.built_route` resolves it on this machine:
    exactly the class ``ROUTES`` names for that route, with that route's name), and no module
    of another chain may be one; every ADMIN residual in
    ``model`` must have ``admin`` equal to ``settings.admin`` (and there must be some).
    Raises :class:`RealformerConfigError` naming the first disagreement.
    """
    for chain, modules in chain_attention.items():
        want = settings.residual(chain)
        for idx, module in enumerate(modules):
            if module is None:
                continue
            got = isinstance(module, RealformerMultiheadAttention)
            if got != want:
                raise RealformerConfigError(
                    f"{model_name} disagrees with its config: chain '{chain}' layer {idx} "
                    f"has {type(module).__name__}, but residual attention is "
                    f"{'on' if want else 'off'} for this chain"
                )
            if got and module.residual_attention_mode != settings.residual_attention_mode:
                raise RealformerConfigError(
                    f"{model_name} disagrees with its config: chain '{chain}' layer {idx} "
                    f"uses the running {module.residual_attention_mode}, the config asks for "
                    f"the running {settings.residual_attention_mode}"
                )
            impl = getattr(module, "residual_attention_impl", "eager")
            route = (
                built_route(settings.residual_attention_impl, chain, settings.cpu) if got else impl
            )
            if got and (impl != route or type(module) is not ROUTES[route]):
                raise RealformerConfigError(
                    f"{model_name} disagrees with its config: chain '{chain}' layer {idx} "
                    f"has {type(module).__name__} with the {impl} route, the config asks for "
                    f"--residual-attention-impl {settings.residual_attention_impl}, which "
                    f"builds the {route} route on this machine"
                )
    residuals = [m for m in model.modules() if isinstance(m, AdminResidual)]
    if not residuals:
        raise RealformerConfigError(f"{model_name} has no ADMIN residual modules")
    for module in residuals:
        if module.admin != settings.admin:
            raise RealformerConfigError(
                f"{model_name} disagrees with its config: an ADMIN residual has "
                f"admin={module.admin}, but --init-type is {settings.init_type}"
            )
    logger.info(built_model_summary(chain_attention, residuals, model_name, settings))


def built_model_summary(chain_attention, residuals, model_name, settings) -> str:
    """One log line counted from the built modules, e.g. ``built --arch realformer_tiny:
    residual attention layers encoder=2/2 decoder=2/2 cross=2/2 (running mean, eager route
    of --residual-attention-impl auto); ADMIN residuals 10/10 (--init-type admin)``."""
    counts = []
    for chain, modules in chain_attention.items():
        present = [m for m in modules if m is not None]
        residual = sum(isinstance(m, RealformerMultiheadAttention) for m in present)
        counts.append(f"{chain}={residual}/{len(present)}")
    mode = settings.residual_attention_mode
    routes = {
        getattr(m, "residual_attention_impl", "eager")
        for modules in chain_attention.values()
        for m in modules
        if isinstance(m, RealformerMultiheadAttention)
    }
    how = "off"
    if mode:
        how = (
            f"running {mode}, {'/'.join(sorted(routes))} route "
            f"of --residual-attention-impl {settings.residual_attention_impl}"
        )
    return (
        f"built {model_name}: residual attention layers {' '.join(counts)} "
        f"({how}); ADMIN residuals "
        f"{sum(m.admin for m in residuals)}/{len(residuals)} (--init-type {settings.init_type})"
    )
