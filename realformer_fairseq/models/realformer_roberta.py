"""Encoder-only RealFormer (BERT/RoBERTa style) for fairseq's ``masked_lm`` and
``sentence_prediction`` tasks.

He, Ravula, Kanagal, Ainslie. "RealFormer: Transformer Likes Residual Attention"
(Findings of ACL 2021, arXiv 2012.11747), sections 3-4: Post-LN BERT whose
self-attention layers add the previous layer's raw attention scores (running sum,
no running mean in the BERT experiments). ADMIN initialisation (Liu et al., 2020,
arXiv 2004.08249) is available with ``--init-type``, as for the encoder-decoder model.

The model is fairseq's :class:`RobertaModel` with one hook changed:
``RobertaEncoder.build_encoder`` returns a :class:`RealformerTransformerEncoder`
(which threads the encoder score stream). Everything else (LM head,
classification heads, ``--restore-file`` of an MLM checkpoint into a
``sentence_prediction`` run, hub interface) is fairseq's; ``from_pretrained`` returns fairseq's
hub interface with ``fill_mask`` spacing fixed for subword-nmt BPE (``models/hub_interface.py``).

BERT options (``--layernorm-eps``, ``--type-vocab-size``, ``--bert-pooler``, with fairseq's
``--activation-fn gelu_accurate``, BERT's tanh GELU) make the model compute what Google's BERT /
RealFormer TF code computes; ``realformer-import-tf`` converts those checkpoints
(``realformer_fairseq/tf_import``). Token types are added to the token embedding that fairseq's
``forward_embedding`` takes (``token_embeddings``), so fairseq's embedding code is unchanged.

Architectures ``realformer_bert_*`` (Post-LN + residual attention, the paper's
system), ``postln_bert_*`` (Post-LN BERT baseline) and ``preln_bert_*`` (Pre-LN
baseline, as fairseq's ``roberta_prenorm``) at the paper's Table 1 sizes (``tiny``,
``small``, ``base``, ``large``, ``xlarge``): their defaults are in
:mod:`realformer_fairseq.models.architectures`.
"""

import logging
import os
from typing import Optional

import torch
from fairseq import utils
from fairseq.models import register_model
from fairseq.models.roberta.model import RobertaEncoder, RobertaModel
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from omegaconf import OmegaConf
from torch import Tensor, nn

from ..errors import RealformerConfigError, one_line_under_fairseq_commands
from ..modules.admin import AdminProfilingMixin
from ..modules.bert import (
    BertClassificationHead,
    BertPooler,
    layer_norms,
    segment_ids_from_separator,
    set_layer_norm_eps,
)
from ..modules.dropout_names import RetainDropoutNamesMixin
from ..modules.realformer_layer import (
    RealformerTransformerConfig,
    every_layer,
    realformer_config,
    settings_of,
)
from ..settings import add_realformer_args, parse_residual_chains
from .architectures import register_family_architectures, register_family_base_architecture
from .build_checks import arch_label, check_layers_match_settings, settings_for_build
from .checkpoint_guard import ArchCheckedLoadMixin
from .realformer_transformer import RealformerTransformerEncoder
from .span_heads import SpanHeadMixin

logger = logging.getLogger(__name__)

ENCODER_ONLY_CHAINS = ("encoder",)


class RealformerRobertaSentenceEncoder(RealformerTransformerEncoder):
    """The encoder-only model's :class:`RealformerTransformerEncoder`, with BERT's token-type
    embeddings (``embed_token_types``) when ``--type-vocab-size`` is set.

    ``forward`` adds ``embed_token_types(token_type_ids)`` to the token embeddings and hands
    them to fairseq's ``forward_embedding`` as ``token_embeddings`` (which fairseq scales by
    ``embed_scale``, 1 in RoBERTa/BERT, then adds positions and the embedding LayerNorm): BERT's
    ``LN(word + type + position)``. Without ids, they are derived from the separator ``</s>``
    (:func:`~realformer_fairseq.modules.bert.segment_ids_from_separator`)."""

    def __init__(self, cfg: RealformerTransformerConfig, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        types = settings_of(cfg).type_vocab_size
        self.separator_idx = dictionary.eos()
        self.embed_token_types: Optional[nn.Embedding] = None
        if types:
            if self.embed_scale != 1.0:
                raise RealformerConfigError(
                    "--type-vocab-size needs unscaled token embeddings (--no-scale-embedding, "
                    "as in RoBERTa/BERT)"
                )
            self.embed_token_types = nn.Embedding(types, embed_tokens.embedding_dim)

    def forward(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
        token_type_ids: Optional[Tensor] = None,
    ):
        if self.embed_token_types is None:
            if token_type_ids is not None:
                raise RealformerConfigError(
                    "token_type_ids given, but the model has no token-type embeddings "
                    "(--type-vocab-size 0)"
                )
        else:
            if token_type_ids is None:
                token_type_ids = segment_ids_from_separator(
                    src_tokens, self.separator_idx, self.padding_idx
                )
            elif token_type_ids.shape != src_tokens.shape:
                raise RealformerConfigError(
                    f"token_type_ids {tuple(token_type_ids.shape)} and src_tokens "
                    f"{tuple(src_tokens.shape)} differ in shape"
                )
            if token_embeddings is None:
                token_embeddings = self.embed_tokens(src_tokens)
            token_embeddings = token_embeddings + self.embed_token_types(token_type_ids)
        return super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)


class RealformerRobertaEncoder(RobertaEncoder):
    """fairseq's :class:`RobertaEncoder` whose sentence encoder is a
    :class:`RealformerRobertaSentenceEncoder` (residual attention, ADMIN residuals, token
    types), with BERT's pooler (``pooler``) under ``--bert-pooler`` and every LayerNorm's
    epsilon set to ``--layernorm-eps``.

    ``cfg`` is a :class:`RealformerTransformerConfig` (the model config with every key, plus
    the plugin's settings), which fairseq's ``__init__`` hands to ``build_encoder``."""

    def __init__(self, cfg: RealformerTransformerConfig, dictionary):
        settings = settings_of(cfg)  # refuse a config without the settings, before building
        super().__init__(cfg, dictionary)
        self.pooler: Optional[BertPooler] = None
        if settings.bert_pooler:
            self.pooler = BertPooler(cfg.encoder.embed_dim, cfg.pooler_activation_fn)
            self.pooler.apply(init_bert_params)
        if settings.layernorm_eps is not None:
            set_layer_norm_eps(self, settings.layernorm_eps)

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = RealformerRobertaSentenceEncoder(args, dictionary, embed_tokens)
        encoder.apply(init_bert_params)
        return encoder

    def forward(
        self,
        src_tokens,
        features_only=False,
        return_all_hiddens=False,
        masked_tokens=None,
        token_type_ids=None,
        **unused,
    ):
        """fairseq 0.12.3's ``RobertaEncoder.forward``, passing ``token_type_ids`` on."""
        x, extra = self.extract_features(
            src_tokens, return_all_hiddens=return_all_hiddens, token_type_ids=token_type_ids
        )
        if not features_only:
            x = self.output_layer(x, masked_tokens=masked_tokens)
        return x, extra

    def extract_features(self, src_tokens, return_all_hiddens=False, token_type_ids=None, **kwargs):
        """fairseq 0.12.3's ``RobertaEncoder.extract_features``, passing ``token_type_ids`` on."""
        encoder_out = self.sentence_encoder(
            src_tokens,
            return_all_hiddens=return_all_hiddens,
            token_embeddings=kwargs.get("token_embeddings", None),
            token_type_ids=token_type_ids,
        )
        # T x B x C -> B x T x C
        features = encoder_out["encoder_out"][0].transpose(0, 1)
        inner_states = encoder_out["encoder_states"] if return_all_hiddens else None
        return features, {"inner_states": inner_states}


@register_model("realformer_roberta")
class RealformerRobertaModel(
    SpanHeadMixin, RetainDropoutNamesMixin, ArchCheckedLoadMixin, AdminProfilingMixin, RobertaModel
):
    """fairseq's :class:`RobertaModel` with RealFormer residual attention in its
    encoder and optional ADMIN initialisation (profiled on the first training
    batch of ``masked_lm`` or ``sentence_prediction``, or closed form), and span heads for
    SQuAD (``models/span_heads.py``, registered by the plugin's ``squad`` task).

    Like fairseq 0.12.3's ``RobertaModel``, it does not compile with TorchScript (its
    ``forward`` takes ``**kwargs``)."""

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        settings = settings_of(encoder.args)
        self.register_admin_state(
            settings.init_type,
            settings.admin_profile_out,
            {"encoder": 2 * len(encoder.sentence_encoder.layers)},
        )
        self.register_arch_check()
        self._register_state_dict_hook(_record_bert_computation)

    @classmethod
    def add_args(cls, parser):
        RobertaModel.add_args(parser)
        add_realformer_args(parser)

    @classmethod
    @one_line_under_fairseq_commands
    def build_model(cls, args, task):
        """Mirrors fairseq 0.12.3 ``RobertaModel.build_model``, which hard-codes
        ``RobertaEncoder``; this one reads the plugin's settings once, builds a
        :class:`RealformerRobertaEncoder` with them and refuses a model that does not match
        them."""
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)

        realformer_roberta_base_architecture(args)
        settings = settings_for_build(
            args, ENCODER_ONLY_CHAINS, "this encoder-only model", bert_options=True
        )

        if not utils.safe_hasattr(args, "max_positions"):
            if not utils.safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample

        encoder = RealformerRobertaEncoder(
            realformer_config(args, settings), task.source_dictionary
        )

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)

        model = cls(args, encoder)
        layers = encoder.sentence_encoder.layers
        check_layers_match_settings(
            settings,
            {"encoder": [layer.self_attn for layer in every_layer(layers)]},
            model,
            model_name=arch_label(args, "realformer_roberta"),
        )
        check_bert_options(settings, model, arch_label(args, "realformer_roberta"))
        return model

    @one_line_under_fairseq_commands
    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """Refuse a checkpoint made with BERT options (recorded in its metadata, e.g. one
        written by ``realformer-import-tf``) into a model whose options compute something else
        (same parameter shapes, other numbers: LayerNorm epsilon, GELU form, running mean),
        then load as fairseq does."""
        recorded = (getattr(state_dict, "_metadata", None) or {}).get("", {}).get(_BERT_KEY)
        if recorded:
            recorded = canonical_bert_computation(recorded)
            own = bert_computation(self.encoder.args)
            differ = [k for k in recorded if k in own and recorded[k] != own[k]]
            if differ:
                flags = " ".join(f"--{k.replace('_', '-')} {recorded[k]}" for k in differ)
                mine = " ".join(f"--{k.replace('_', '-')} {own[k]}" for k in differ)
                raise RealformerConfigError(
                    f"the checkpoint was made with {flags}, this model has {mine}: pass the "
                    "checkpoint's flags (a realformer-import-tf folder lists every model flag "
                    "in model_args.txt)"
                )
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def register_classification_head(self, name, num_classes=None, inner_dim=None, **kwargs):
        """fairseq's, with BERT's head (:class:`BertClassificationHead`: pooler, dropout, output
        layer) under ``--bert-pooler``."""
        super().register_classification_head(name, num_classes, inner_dim, **kwargs)
        if self.encoder.pooler is not None:
            fairseq_head = self.classification_heads[name]
            head = BertClassificationHead(
                input_dim=self.args.encoder_embed_dim,
                inner_dim=inner_dim or self.args.encoder_embed_dim,
                num_classes=num_classes,
                activation_fn=self.args.pooler_activation_fn,
                pooler_dropout=self.args.pooler_dropout,
                q_noise=self.args.quant_noise_pq,
                qn_block_size=self.args.quant_noise_pq_block_size,
                do_spectral_norm=self.args.spectral_norm_classification_head,
            )
            head.load_state_dict(fairseq_head.state_dict())  # the same initial values
            self.classification_heads[name] = head

    def upgrade_state_dict_named(self, state_dict, name):
        """fairseq's (which fills a head the checkpoint lacks with its current, random
        values); then, under ``--bert-pooler``, such a head's ``dense`` is the checkpoint's
        pre-trained pooler, as BERT's ``run_classifier`` fine-tunes from the pooler."""
        prefix = name + "." if name != "" else ""
        had = {k for k in state_dict if k.startswith(prefix + "classification_heads.")}
        super().upgrade_state_dict_named(state_dict, name)
        pooler = prefix + "encoder.pooler.dense."
        if self.encoder.pooler is None or pooler + "weight" not in state_dict:
            return
        for head in self.classification_heads:
            key = f"{prefix}classification_heads.{head}.dense."
            if key + "weight" in had:
                continue
            if state_dict[key + "weight"].shape != state_dict[pooler + "weight"].shape:
                continue  # another --inner-dim: nothing to start from
            for part in ("weight", "bias"):
                state_dict[key + part] = state_dict[pooler + part].clone()
            logger.info(
                "classification head '%s': dense initialised from the pre-trained pooler "
                "(encoder.pooler.dense), as BERT's run_classifier",
                head,
            )

    def pooled_output(self, features: Tensor) -> Tensor:
        """BERT's ``pooled_output`` of ``features`` (batch x length x dim; ``--bert-pooler``)."""
        if self.encoder.pooler is None:
            raise RealformerConfigError("the model has no pooler (--bert-pooler)")
        return self.encoder.pooler(features)

    @classmethod
    def from_pretrained(
        cls,
        model_name_or_path,
        checkpoint_file="model.pt",
        data_name_or_path=".",
        bpe="auto",
        **kwargs,
    ):
        """Mirrors fairseq 0.12.3's ``RobertaModel.from_pretrained`` (same arguments:
        ``data_name_or_path``, ``bpe``, ``bpe_codes``, ...), returning a
        :class:`RealformerRobertaHubInterface`; fairseq's always overrides the BPE.

        ``bpe="auto"`` (the default): a folder written by ``realformer-import-tf`` (it has
        ``vocab.txt``), or a model whose ``data_name_or_path`` has one (a SQuAD data-bin), keeps
        the checkpoint's own BPE (``wordpiece``, cased or not as converted) with that
        ``vocab.txt``; any other folder gets fairseq's default, ``gpt2``."""
        from .hub_interface import RealformerRobertaHubInterface, warn_if_not_plugin_model

        if bpe == "auto":
            folders = [str(model_name_or_path)]
            data = str(data_name_or_path)
            if data != ".":  # as fairseq's hub_utils resolves it
                folders.append(
                    os.path.join(str(model_name_or_path), data) if data.startswith(".") else data
                )
            vocabs = [os.path.join(f, "vocab.txt") for f in folders]
            vocabs = [v for v in vocabs if os.path.exists(v)]
            if vocabs:
                kwargs.setdefault("wordpiece_vocab", os.path.abspath(vocabs[0]))
            else:
                kwargs["bpe"] = "gpt2"
        else:
            kwargs["bpe"] = bpe
        from fairseq import hub_utils

        x = hub_utils.from_pretrained(
            model_name_or_path,
            checkpoint_file,
            data_name_or_path,
            archive_map=cls.hub_models(),
            load_checkpoint_heads=True,
            **kwargs,
        )
        warn_if_not_plugin_model(x["models"], cls, f"{model_name_or_path}/{checkpoint_file}")
        return RealformerRobertaHubInterface(x["args"], x["task"], x["models"][0])

    def forward(
        self,
        src_tokens,
        features_only=False,
        return_all_hiddens=False,
        classification_head_name=None,
        **kwargs,
    ):
        if not torch.jit.is_scripting():
            self.profile_admin_if_needed(
                src_tokens,
                features_only=features_only,
                return_all_hiddens=return_all_hiddens,
                classification_head_name=classification_head_name,
                **kwargs,
            )
        return super().forward(
            src_tokens,
            features_only=features_only,
            return_all_hiddens=return_all_hiddens,
            classification_head_name=classification_head_name,
            **kwargs,
        )


_BERT_KEY = "realformer_bert_options"


def bert_computation(cfg: RealformerTransformerConfig) -> dict:
    """What changes the numbers a built model computes without changing its parameter shapes,
    from the encoder's config ``cfg`` (``model.encoder.args``): the plugin's flags from its
    settings (the settings module's one reading; a config without them is an error), fairseq's
    from the config the encoder was built with (LayerNorm epsilon ``None`` is fairseq's 1e-5)."""
    settings = settings_of(cfg)
    return {
        "layernorm_eps": 1e-5 if settings.layernorm_eps is None else settings.layernorm_eps,
        "activation_fn": cfg.activation_fn,
        "pooler_activation_fn": cfg.pooler_activation_fn,
        "residual_attention": ",".join(sorted(settings.residual_chains)) or "none",
        "residual_attention_mode": settings.residual_attention_mode,
        "encoder_normalize_before": bool(cfg.encoder.normalize_before),
    }


def canonical_bert_computation(recorded: dict) -> dict:
    """A checkpoint's record in :func:`bert_computation`'s spelling: records written before
    the settings were its source hold ``--residual-attention`` as typed (``all`` and
    ``encoder`` are the same encoder-only model)."""
    recorded = dict(recorded)
    if "residual_attention" in recorded:
        chains = parse_residual_chains(recorded["residual_attention"], ENCODER_ONLY_CHAINS)
        recorded["residual_attention"] = ",".join(sorted(chains)) or "none"
    return recorded


def _record_bert_computation(module, state_dict, prefix, local_metadata):
    """State-dict hook: a model with BERT options records what it computes (see
    ``load_state_dict``); other models record nothing, so their checkpoints are unchanged."""
    settings = settings_of(module.encoder.args)
    if settings.layernorm_eps is not None or settings.type_vocab_size or settings.bert_pooler:
        local_metadata[_BERT_KEY] = bert_computation(module.encoder.args)


def check_bert_options(settings, model, model_name: str):
    """Refuse a built model whose BERT options differ from ``settings`` (LayerNorm epsilon,
    token-type embeddings, pooler); log one line counted from the modules."""
    encoder = model.encoder
    norms = list(layer_norms(encoder))
    if settings.layernorm_eps is not None:
        wrong = [n for n in norms if n.eps != settings.layernorm_eps]
        if wrong:
            raise RealformerConfigError(
                f"{model_name} disagrees with its config: {len(wrong)} LayerNorm(s) have eps "
                f"{wrong[0].eps}, --layernorm-eps is {settings.layernorm_eps}"
            )
    types = encoder.sentence_encoder.embed_token_types
    if (types.num_embeddings if types is not None else 0) != settings.type_vocab_size:
        raise RealformerConfigError(
            f"{model_name} disagrees with its config: token-type embeddings "
            f"{types}, --type-vocab-size {settings.type_vocab_size}"
        )
    if (encoder.pooler is not None) != settings.bert_pooler:
        raise RealformerConfigError(f"{model_name} disagrees with its config: the pooler")
    if settings.layernorm_eps is not None or settings.type_vocab_size or settings.bert_pooler:
        logger.info(
            "built %s BERT options: LayerNorm eps %g (%d LayerNorms), %d token types%s, "
            "pooler %s",
            model_name,
            norms[0].eps if norms else float("nan"),
            len(norms),
            settings.type_vocab_size,
            " (ids from </s> where none are given)" if settings.type_vocab_size else "",
            "on" if encoder.pooler is not None else "off",
        )


# Architectures: every default is in models/architectures.py (FAMILIES).

realformer_roberta_base_architecture = register_family_base_architecture("realformer_roberta")

BERT_ARCHITECTURES = register_family_architectures("realformer_roberta")
