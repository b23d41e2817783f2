"""The plugin's flags: declared, read and validated here, once per model build.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(arXiv 2012.11747): which attention score chains are residual, and whether the softmax
sees the running sum or the running mean. Liu et al. "Understanding the Difficulty of
Training Transformers" (arXiv 2004.08249): ADMIN initialisation of the residuals.

This module is the bottom of the package: it imports nothing from ``models/`` or
``modules/``. :data:`FLAGS` declares every plugin flag (the command line of every model
family is made from it); :func:`read_realformer_settings` is the one function that reads
them from a model config, checks them and returns the frozen :class:`RealformerSettings`
that the models pass, as explicit values, to their encoders, decoders, layers, attention
modules and ADMIN residuals.

fairseq hands ``build_model`` an argparse ``Namespace`` (``fairseq-train``, checkpoints
saved by it) or an omegaconf ``DictConfig`` (``fairseq-hydra-train``, checkpoints saved
by it, ``task.build_model(cfg)``), and its legacy transformer classes convert either to a
``TransformerConfig``, keeping keys that are not its fields only for a ``Namespace``. The
flags therefore are never looked up further down with ``safe_getattr(..., default)``: on a
``DictConfig`` they would silently fall back to a vanilla transformer. A flag that is
missing is an error, never a default.
"""

import dataclasses
import importlib.util
import sys
from typing import Any, Dict, FrozenSet, Mapping, Optional, Sequence

from .errors import RealformerConfigError

RESIDUAL_CHAINS = ("encoder", "decoder", "cross")
RESIDUAL_ATTENTION_MODES = ("sum", "mean")
# The routes of --residual-attention-impl, name -> route class: the one list of them. It is
# realformer_fairseq.modules.routes.ROUTES, which names the classes (this module imports nothing
# from modules/); the flag's choices and help and the check of a config read it when they run.
ROUTES: Dict[str, type] = {}
# what --residual-attention-impl triton needs and how to get it (one line)
TRITON_INSTALL = "pip install -e '.[triton]' in the clone (CUDA builds of torch ship triton)"
TRITON_MISSING = (
    "--residual-attention-impl triton needs the triton package, which is not installed in this "
    f"Python: {TRITON_INSTALL}; a checkpoint trained with it runs the same arithmetic on the "
    "eager route with --model-overrides \"{'residual_attention_impl': 'eager'}\""
)
INIT_TYPES = ("default", "admin", "admin-closed-form")
ADMIN_INIT_TYPES = ("admin", "admin-closed-form")


@dataclasses.dataclass(frozen=True)
class Flag:
    """One plugin flag: its config key (``--`` + key with dashes on the command line),
    its argparse declaration, and whether every architecture must set it."""

    key: str
    argparse: Dict[str, Any]
    required: bool = False

    @property
    def option(self) -> str:
        return "--" + self.key.replace("_", "-")


FLAGS = (
    Flag(
        "residual_attention",
        dict(
            metavar="CHAINS",
            help="residual attention (RealFormer) chains: 'all', 'none' or a comma list of "
            "encoder (encoder self-attn), decoder (decoder self-attn), cross (encoder-decoder "
            "attn)",
        ),
        required=True,
    ),
    Flag(
        "residual_attention_mode",
        dict(
            choices=RESIDUAL_ATTENTION_MODES,
            help="sum: softmax over the running sum of scores; mean: over the running mean "
            "(the stream passed on stays the sum; the official code's docstring: 'helpful for "
            "deep RealFormer models with 30+ layers')",
        ),
    ),
    Flag(
        "residual_attention_impl",
        # choices and help: read from ROUTES when a parser is built (add_realformer_args)
        dict(metavar="ROUTE"),
    ),
    Flag(
        "init_type",
        dict(
            choices=INIT_TYPES,
            help="default: fairseq's init; admin: ADMIN omega profiled on the first "
            "training batch; admin-closed-form: admin-torch's data-free omega",
        ),
        required=True,
    ),
    Flag(
        "admin_profile_out",
        dict(
            metavar="FILE",
            help="with --init-type admin: write the profiled omega to this JSON file",
        ),
    ),
    Flag(
        "admin_allow_pre_ln",
        dict(
            action="store_true",
            help="allow --init-type admin* with Pre-LN (ADMIN is meant for Post-LN)",
        ),
    ),
    # BERT-exact options of the encoder-only model (Google's BERT / RealFormer checkpoints)
    Flag(
        "layernorm_eps",
        dict(
            type=float,
            metavar="EPS",
            help="epsilon of every LayerNorm (default: fairseq's 1e-5; BERT: 1e-12); "
            "encoder-only models",
        ),
    ),
    Flag(
        "type_vocab_size",
        dict(
            type=int,
            metavar="N",
            help="token-type (segment) embeddings for N types, added to the token and position "
            "embeddings (BERT); where the task passes no ids (fairseq's masked_lm and "
            "sentence_prediction), a token's type is 0 up to and including the first </s> and 1 "
            "after it ([CLS] A [SEP] B [SEP]). Default 0: none; encoder-only models",
        ),
    ),
    Flag(
        "bert_pooler",
        dict(
            action="store_true",
            help="BERT's pooler (dense + --pooler-activation-fn on the first token, "
            "encoder.pooler); classification heads are pooler -> dropout -> output layer, and a "
            "new head's dense starts from the pre-trained pooler (BERT's run_classifier); "
            "encoder-only models",
        ),
    ),
)
BERT_OPTION_KEYS = ("layernorm_eps", "type_vocab_size", "bert_pooler")
FLAG_KEYS = tuple(flag.key for flag in FLAGS)


def add_realformer_args(parser):
    """Declare :data:`FLAGS` on a model's argparse parser (every family's ``add_args``)."""
    for flag in FLAGS:
        declared = dict(flag.argparse)
        if flag.key == "residual_attention_impl":
            declared.update(choices=tuple(ROUTES), help=routes_help())
        parser.add_argument(flag.option, **declared)


def routes_help() -> str:
    """``--residual-attention-impl``'s help: one clause per route of :data:`ROUTES`."""
    clauses = "; ".join(f"{name}: {route.route_help(name)}" for name, route in ROUTES.items())
    return f"how the residual score chains are computed (the same values): {clauses}"


@dataclasses.dataclass(frozen=True)
class RealformerSettings:
    """What the plugin's flags ask of one model; made only by :func:`read_realformer_settings`."""

    residual_chains: FrozenSet[str]
    residual_attention_mode: Optional[str]  # None exactly when no chain is residual
    residual_attention_impl: Optional[str]  # None exactly when no chain is residual
    init_type: str
    admin_profile_out: Optional[str]
    # BERT options (encoder-only models); the defaults change nothing
    layernorm_eps: Optional[float] = None  # None: fairseq's LayerNorm default
    type_vocab_size: int = 0
    bert_pooler: bool = False
    # where the model is built, not what it computes (so not compared): fairseq's --cpu where
    # the config carries it (fairseq-train's Namespace; not a hydra model config). A CPU build
    # reads no GPU's rule for ``auto`` and never touches CUDA (modules/routes/rules.py)
    cpu: bool = dataclasses.field(default=False, compare=False)

    @property
    def admin(self) -> bool:
        """ADMIN residuals (``residual * omega + x``) in every sublayer."""
        return self.init_type in ADMIN_INIT_TYPES

    def residual(self, chain: str) -> bool:
        """Is ``chain`` (``encoder``, ``decoder`` or ``cross``) a residual score chain?"""
        if chain not in RESIDUAL_CHAINS:
            raise ValueError(f"unknown chain {chain!r}; chains are {RESIDUAL_CHAINS}")
        return chain in self.residual_chains


def parse_residual_chains(value: str, model_chains: Sequence[str] = RESIDUAL_CHAINS) -> set:
    """``--residual-attention`` value: ``all`` (every chain of the model), ``none`` or a comma
    list of ``encoder`` (encoder self-attention), ``decoder`` (decoder self-attention) and
    ``cross`` (decoder encoder-attention), each of them a chain of the model. An empty value is
    an error (it used to turn residual attention off without a word)."""
    if value == "none":
        return set()
    if value == "all":
        return set(model_chains)
    chains = {c.strip() for c in value.split(",") if c.strip()}
    if not chains:
        raise RealformerConfigError(
            f"--residual-attention {value!r}: no chain named; use 'all', 'none' or a comma "
            f"list of {', '.join(model_chains)}"
        )
    unknown = chains - set(RESIDUAL_CHAINS)
    if unknown:
        raise RealformerConfigError(
            f"--residual-attention: unknown chain(s) {sorted(unknown)}; use 'all', "
            f"'none' or a comma list of {', '.join(RESIDUAL_CHAINS)}"
        )
    return chains


_MISSING = object()


def config_value(cfg, key: str, default=_MISSING):
    """``cfg[key]`` for a dict, ``DictConfig``, ``Namespace`` or ``TransformerConfig``;
    ``default`` when the key is absent (a present ``None`` is returned as ``None``)."""
    from omegaconf import OmegaConf

    if isinstance(cfg, Mapping) or OmegaConf.is_config(cfg):
        return cfg[key] if key in cfg else default
    try:
        return getattr(cfg, key)
    except AttributeError:  # TransformerConfig raises it for keys it does not know
        return default


def read_realformer_settings(
    cfg,
    model_chains: Sequence[str] = RESIDUAL_CHAINS,
    model_name: str = "this model",
    bert_options: bool = False,
) -> RealformerSettings:
    """The plugin's settings from a model config of any type fairseq uses (argparse
    ``Namespace``, omegaconf ``DictConfig``, ``TransformerConfig``, plain ``dict``),
    after the architecture's defaults were applied to it: the one place the flags are read.

    ``model_chains`` are the chains the model has (``("encoder",)`` for the encoder-only
    model, ``("decoder",)`` for the language model): ``residual_attention: all`` means all
    of them, naming another one is an error. The required flags must be present: every
    architecture sets them, so a config without them did not go through an architecture and
    is refused rather than read as "off". ``residual_attention_impl`` alone is read as
    ``auto`` where it is missing and a chain is on: it changes how the model computes, never
    what. ``bert_options``: the model carries out ``--layernorm-eps``, ``--type-vocab-size``
    and ``--bert-pooler`` (the encoder-only model); elsewhere they are refused. Every
    combination the model cannot honour raises :class:`RealformerConfigError`, whose
    message is one line.
    """
    values = {}
    for flag in FLAGS:
        value = config_value(cfg, flag.key, None)
        if flag.required and value is None:
            raise RealformerConfigError(
                f"the model config has no {flag.key}: the architecture's defaults were not "
                "applied (build the model through fairseq's build_model / an --arch, "
                f"or set {flag.key} explicitly)"
            )
        values[flag.key] = value

    requested = values["residual_attention"]
    chains = parse_residual_chains(requested, model_chains)
    if chains - set(model_chains):
        raise RealformerConfigError(
            f"--residual-attention {requested}: {model_name} has only the chain(s) "
            f"{', '.join(model_chains)} (use 'all', 'none' or a comma list of these)"
        )

    mode = values["residual_attention_mode"]
    if mode is not None and mode not in RESIDUAL_ATTENTION_MODES:
        raise RealformerConfigError(
            f"--residual-attention-mode {mode}: use one of {', '.join(RESIDUAL_ATTENTION_MODES)}"
        )
    if chains and mode is None:
        raise RealformerConfigError(
            f"--residual-attention {requested} needs --residual-attention-mode "
            f"({' or '.join(RESIDUAL_ATTENTION_MODES)}); the architecture did not set it"
        )
    if mode is not None and not chains:
        raise RealformerConfigError(
            f"--residual-attention-mode {mode} needs residual attention on "
            f"(--residual-attention is '{requested}' for this architecture)"
        )

    impl = values["residual_attention_impl"]
    if impl is not None and impl not in ROUTES:
        raise RealformerConfigError(
            f"--residual-attention-impl {impl}: use one of {', '.join(ROUTES)}"
        )
    if chains and impl is None:
        # the one flag read with a default: every value computes the same model (configs
        # and checkpoints from before the flag existed have none)
        impl = "auto"
    elif impl is not None and not chains:
        raise RealformerConfigError(
            f"--residual-attention-impl {impl} needs residual attention on "
            f"(--residual-attention is '{requested}' for this architecture)"
        )
    if impl == "triton" and not triton_installed():
        raise RealformerConfigError(TRITON_MISSING)

    init_type = values["init_type"]
    if init_type not in INIT_TYPES:
        raise RealformerConfigError(f"--init-type {init_type}: use one of {', '.join(INIT_TYPES)}")
    pre_ln = any(
        config_value(cfg, f"{stack}_normalize_before", False)
        for stack in ("encoder", "decoder")
        if stack in model_chains
    )
    if init_type != "default" and pre_ln and not values["admin_allow_pre_ln"]:
        raise RealformerConfigError(
            f"--init-type {init_type} is for Post-LN models, but this one is Pre-LN "
            "(--encoder/decoder-normalize-before); pass --admin-allow-pre-ln to use it anyway"
        )
    if values["admin_profile_out"] and init_type != "admin":
        raise RealformerConfigError("--admin-profile-out needs --init-type admin")

    eps, types, pooler = (values[k] for k in BERT_OPTION_KEYS)
    types = 0 if types is None else types
    if not bert_options:
        for flag, given in (
            ("--layernorm-eps", eps is not None),
            ("--type-vocab-size", types),
            ("--bert-pooler", pooler),
        ):
            if given:
                raise RealformerConfigError(
                    f"{flag} is an option of the encoder-only model (realformer_roberta); "
                    f"{model_name} would not carry it out"
                )
    if eps is not None and not eps > 0:
        raise RealformerConfigError(f"--layernorm-eps {eps}: must be positive")
    if types < 0:
        raise RealformerConfigError(f"--type-vocab-size {types}: must be 0 (none) or more")

    return RealformerSettings(
        residual_chains=frozenset(chains),
        residual_attention_mode=mode,
        residual_attention_impl=impl,
        init_type=init_type,
        admin_profile_out=values["admin_profile_out"] or None,
        layernorm_eps=None if eps is None else float(eps),
        type_vocab_size=int(types),
        bert_pooler=bool(pooler),
        cpu=bool(config_value(cfg, "cpu", False)),
    )


def triton_installed() -> bool:
    """Is the ``triton`` package importable here? Asked without importing it (its import
    takes seconds; CPU builds never import it). ``sys.modules["triton"] = None``, Python's
    way to block an import, answers no."""
    if "triton" in sys.modules:
        return sys.modules["triton"] is not None
    return importlib.util.find_spec("triton") is not None
