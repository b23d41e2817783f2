"""The plugin's settings, read once from whatever config fairseq hands a model.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(arXiv 2012.11747): which attention score chains are residual, and whether the softmax
sees the running sum or the running mean. Liu et al. "Understanding the Difficulty of
Training Transformers" (arXiv 2004.08249): ADMIN initialisation of the residuals.

fairseq hands ``build_model`` an argparse ``Namespace`` (``fairseq-train``, checkpoints
saved by it) or an omegaconf ``DictConfig`` (``fairseq-hydra-train``, checkpoints saved
by it, ``task.build_model(cfg)``), and its legacy transformer classes convert either to a
``TransformerConfig``, keeping keys that are not its fields only for a ``Namespace``. The
plugin's flags therefore must not be looked up further down with ``safe_getattr(...,
default)``: on a ``DictConfig`` they would silently fall back to a vanilla transformer.

Instead, ``build_model`` calls :func:`read_realformer_settings` once, after the
architecture's defaults are applied, and passes the frozen :class:`RealformerSettings`
explicitly to the encoder/decoder, which pass explicit values on to their layers,
attention modules and ADMIN residuals. A flag that is missing is an error, never a default.
After building, :func:`check_layers_match_settings` compares the built model with the
settings and refuses any disagreement with one error line.
"""

import argparse
import dataclasses
import logging
from typing import Dict, FrozenSet, Iterable, Mapping, Optional, Sequence

from torch import nn

from .errors import RealformerConfigError
from .modules.admin import INIT_TYPES, AdminResidual
from .modules.residual_attention import RESIDUAL_ATTENTION_MODES, RealformerMultiheadAttention

logger = logging.getLogger(__name__)

RESIDUAL_CHAINS = ("encoder", "decoder", "cross")
ADMIN_INIT_TYPES = ("admin", "admin-closed-form")


def parse_residual_chains(value: Optional[str]) -> set:
    """``--residual-attention`` value: ``all``, ``none`` or a comma list of
    ``encoder`` (encoder self-attention), ``decoder`` (decoder self-attention)
    and ``cross`` (decoder encoder-attention)."""
    if value is None or value == "none" or value == "":
        return set()
    if value == "all":
        return set(RESIDUAL_CHAINS)
    chains = {c.strip() for c in value.split(",") if c.strip()}
    unknown = chains - set(RESIDUAL_CHAINS)
    if unknown:
        raise RealformerConfigError(
            f"--residual-attention: unknown chain(s) {sorted(unknown)}; use 'all', "
            f"'none' or a comma list of {', '.join(RESIDUAL_CHAINS)}"
        )
    return chains


@dataclasses.dataclass(frozen=True)
class RealformerSettings:
    """What the plugin's flags ask of one model; built by :func:`read_realformer_settings`."""

    residual_chains: FrozenSet[str]
    residual_attention_mode: Optional[str]  # None exactly when no chain is residual
    init_type: str
    admin_profile_out: Optional[str]
    admin_allow_pre_ln: bool

    @property
    def admin(self) -> bool:
        """ADMIN residuals (``residual * omega + x``) in every sublayer."""
        return self.init_type in ADMIN_INIT_TYPES

    def residual(self, chain: str) -> bool:
        """Is ``chain`` (``encoder``, ``decoder`` or ``cross``) a residual score chain?"""
        if chain not in RESIDUAL_CHAINS:
            raise ValueError(f"unknown chain {chain!r}; chains are {RESIDUAL_CHAINS}")
        return chain in self.residual_chains


_MISSING = object()


def config_value(cfg, key: str):
    """``cfg[key]`` for a dict, ``DictConfig``, ``Namespace`` or ``TransformerConfig``;
    ``_MISSING`` when the key is absent (a present ``None`` is returned as ``None``)."""
    from omegaconf import OmegaConf

    if isinstance(cfg, Mapping) or OmegaConf.is_config(cfg):
        return cfg[key] if key in cfg else _MISSING
    try:
        return getattr(cfg, key)
    except AttributeError:  # TransformerConfig raises it for keys it does not know
        return _MISSING


def read_realformer_settings(
    cfg, model_chains: Sequence[str] = RESIDUAL_CHAINS, model_name: str = "this model"
) -> RealformerSettings:
    """The plugin's settings from a model config of any type fairseq uses (argparse
    ``Namespace``, omegaconf ``DictConfig``, ``TransformerConfig``, plain ``dict``),
    after the architecture's defaults were applied to it.

    ``model_chains`` are the chains the model has; ``residual_attention: all`` means
    all of them, naming another one is an error. ``residual_attention`` and
    ``init_type`` must be present: every architecture sets them, so a config without
    them did not go through an architecture and is refused rather than read as "off".
    Raises :class:`RealformerConfigError`.
    """
    values = {}
    for key in ("residual_attention", "init_type"):
        value = config_value(cfg, key)
        if value is _MISSING or value is None:
            raise RealformerConfigError(
                f"the model config has no {key}: the architecture's defaults were not "
                "applied (build the model through fairseq's build_model / an --arch, "
                f"or set {key} explicitly)"
            )
        values[key] = value
    optional = {}
    for key in ("residual_attention_mode", "admin_profile_out", "admin_allow_pre_ln"):
        value = config_value(cfg, key)
        optional[key] = None if value is _MISSING else value

    requested = values["residual_attention"]
    chains = parse_residual_chains(requested)
    if requested != "all" and chains - set(model_chains):
        raise RealformerConfigError(
            f"--residual-attention {requested}: {model_name} has only the chain(s) "
            f"{', '.join(model_chains)} (use 'all', 'none' or a comma list of these)"
        )
    chains &= set(model_chains)

    mode = optional["residual_attention_mode"]
    if chains and mode is None:
        raise RealformerConfigError(
            f"--residual-attention {requested} needs --residual-attention-mode "
            f"({' or '.join(RESIDUAL_ATTENTION_MODES)}); the architecture did not set it"
        )
    if mode is not None and mode not in RESIDUAL_ATTENTION_MODES:
        raise RealformerConfigError(
            f"--residual-attention-mode {mode}: use one of {', '.join(RESIDUAL_ATTENTION_MODES)}"
        )
    if not chains:
        mode = None  # validate_realformer_args refuses an explicit mode with no chain
    init_type = values["init_type"]
    if init_type not in INIT_TYPES:
        raise RealformerConfigError(f"--init-type {init_type}: use one of {', '.join(INIT_TYPES)}")
    return RealformerSettings(
        residual_chains=frozenset(chains),
        residual_attention_mode=mode,
        init_type=init_type,
        admin_profile_out=optional["admin_profile_out"] or None,
        admin_allow_pre_ln=bool(optional["admin_allow_pre_ln"]),
    )


def namespace_of(cfg) -> argparse.Namespace:
    """A flat ``Namespace`` copy of a legacy model config (``Namespace`` or
    ``DictConfig``), so that fairseq's ``TransformerConfig.from_namespace`` keeps every
    key: for a ``DictConfig`` it would keep only its own dataclass fields."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg):
        return argparse.Namespace(**OmegaConf.to_container(cfg, resolve=True))
    if isinstance(cfg, Mapping):
        return argparse.Namespace(**cfg)
    return cfg


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
    requested mode, and no module of another chain may be; every ADMIN residual in
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
    residual attention layers encoder=2/2 decoder=2/2 cross=2/2 (running mean);
    ADMIN residuals 10/10 (--init-type admin)``."""
    counts = []
    for chain, modules in chain_attention.items():
        present = [m for m in modules if m is not None]
        residual = sum(isinstance(m, RealformerMultiheadAttention) for m in present)
        counts.append(f"{chain}={residual}/{len(present)}")
    mode = settings.residual_attention_mode
    return (
        f"built {model_name}: residual attention layers {' '.join(counts)} "
        f"({'running ' + mode if mode else 'off'}); ADMIN residuals "
        f"{sum(m.admin for m in residuals)}/{len(residuals)} (--init-type {settings.init_type})"
    )
