"""Google's TF1 BERT-layout checkpoints (RealFormer: He, Ravula, Kanagal, Ainslie 2020, arXiv
2012.11747, google-research ``realformer/realformer.py``; BERT: google-research/bert) ->
a fairseq ``realformer_roberta`` checkpoint.

:func:`convert_checkpoint` reads ``bert_config.json``, ``vocab.txt`` and the tensor bundle
(``tensor_bundle.read_bundle``, no TensorFlow), maps every variable to a parameter of the
fairseq model (table: ``docs/tf_checkpoints.md``) or skips it by one of the rules in
:data:`SKIP_RULES`, and writes ``OUT_DIR/model.pt`` (loadable by ``from_pretrained``,
``checkpoint_utils.load_model_ensemble`` and ``fairseq-train --restore-file``),
``OUT_DIR/dict.txt`` and ``OUT_DIR/vocab.txt``. Any variable that is neither, any missing one,
and any shape that disagrees with ``bert_config.json`` raises :class:`BertCheckpointError`
naming it.

The model computes what realformer.py computes (checked against TF's outputs by the tests):
``--layernorm-eps 1e-12``, ``--activation-fn gelu_accurate`` (BERT's tanh GELU, FFN and MLM
transform), post-LN with an embedding LayerNorm, learned positions (BERT row ``i`` is fairseq
row ``padding_idx + 1 + i``, where fairseq's learned positions put token ``i`` of a right-padded
sequence), ``--type-vocab-size`` token-type embeddings, ``--bert-pooler`` (dense + tanh on the
first token; new classification heads start from it), the MLM head as fairseq's
``RobertaLMHead`` (tied weights), the next-sentence head as the classification head
``next_sentence``, and residual attention with the running sum or mean of
``use_running_mean``.
"""

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..atomic_files import atomic_directory, write_text_atomic
from ..errors import RealformerConfigError
from .tensor_bundle import TensorBundle, read_bundle
from .wordpiece import WordPieceVocabulary, resolve_lowercase

logger = logging.getLogger(__name__)

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # --user-dir
NEXT_SENTENCE_HEAD = "next_sentence"
BERT_LAYERNORM_EPS = 1e-12  # tf_slim layer_norm -> tf.nn.batch_normalization(variance_epsilon)
# BERT's hidden_act -> fairseq --activation-fn ("gelu" is BERT's tanh approximation)
ACTIVATIONS = {"gelu": "gelu_accurate", "relu": "relu", "tanh": "tanh", "linear": "linear"}


# state-dict entries of the fairseq model that no TF variable gives: fairseq's encoder version
# marker, and the ADMIN "profiled" flag (no ADMIN here: --init-type default)
MODEL_OWN_KEYS = ("encoder.sentence_encoder.version", "admin_profiled")


class BertCheckpointError(RealformerConfigError):
    """A checkpoint, config or vocabulary that cannot be converted; one line."""


# ------------------------------------------------------------------ bert_config.json


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """realformer.py's ``BertConfig`` (its defaults where bert_config.json has no key)."""

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 16
    initializer_range: float = 0.02
    use_running_mean: bool = False

    # keys some of Google's configs carry that realformer.py / modeling.py never read
    IGNORED_KEYS = (
        "directionality",
        "pooler_fc_size",
        "pooler_num_attention_heads",
        "pooler_num_fc_layers",
        "pooler_size_per_head",
        "pooler_type",
    )

    @classmethod
    def from_json_file(cls, path: str) -> "BertConfig":
        try:
            with open(path, encoding="utf-8") as f:
                values = json.load(f)
        except FileNotFoundError:
            raise BertCheckpointError(f"no BERT config file {path}") from None
        except json.JSONDecodeError as err:
            raise BertCheckpointError(f"{path}: not JSON ({err})") from None
        if not isinstance(values, dict):
            raise BertCheckpointError(f"{path}: not a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in values if k not in fields and k not in cls.IGNORED_KEYS)
        if unknown:
            raise BertCheckpointError(
                f"{path}: unknown key(s) {', '.join(unknown)} (realformer.py's BertConfig has "
                f"{', '.join(fields)})"
            )
        if "vocab_size" not in values:
            raise BertCheckpointError(f"{path} has no vocab_size")
        kwargs = {}
        for name, value in values.items():
            if name not in fields:
                continue
            kind = fields[name].type
            ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
            if isinstance(value, bool) and kind is not bool:
                ok = False
            if not ok:
                raise BertCheckpointError(f"{path}: {name} is {value!r}, not a {kind.__name__}")
            kwargs[name] = kind(value)
        config = cls(**kwargs)
        config.check(path)
        return config

    def check(self, path: str):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            if getattr(self, name) < 1:
                raise BertCheckpointError(f"{path}: {name} must be positive")
        if self.hidden_size % self.num_attention_heads:
            raise BertCheckpointError(
                f"{path}: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act.lower() not in ACTIVATIONS:
            raise BertCheckpointError(
                f"{path}: hidden_act {self.hidden_act!r}; realformer.py knows "
                f"{', '.join(ACTIVATIONS)}"
            )
        if self.type_vocab_size < 0:
            raise BertCheckpointError(f"{path}: type_vocab_size must not be negative")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads


# ------------------------------------------------------------------ the variable mapping

# How a TF tensor becomes a fairseq one.
KERNEL = "kernel -> weight: transposed ([in, out] -> [out, in])"
COPY = "copied"


@dataclasses.dataclass(frozen=True)
class Mapping:
    tf_name: str
    fairseq_names: Tuple[str, ...]  # more than one: tied parameters
    shape: Tuple[int, ...]  # expected TF shape (from bert_config.json)
    how: str
    head: str  # "encoder", "pooler", "mlm" or "nsp"


def variable_mappings(config: BertConfig, padding_idx: int = 1) -> List[Mapping]:
    """Every TF variable a BERT-layout checkpoint may hold, with its fairseq parameter(s)."""
    D, F, V = config.hidden_size, config.intermediate_size, config.vocab_size
    s = "encoder.sentence_encoder."
    out = [
        Mapping(
            "bert/embeddings/word_embeddings",
            (s + "embed_tokens.weight", "encoder.lm_head.weight"),
            (V, D),
            "rows permuted from BERT to fairseq vocabulary order (dict.txt); tied to the "
            "MLM output weights",
            "encoder",
        ),
        Mapping(
            "bert/embeddings/position_embeddings",
            (s + "embed_positions.weight",),
            (config.max_position_embeddings, D),
            f"BERT row i -> fairseq row {padding_idx + 1} + i (rows 0..{padding_idx} zero: "
            "fairseq's unused row and padding row)",
            "encoder",
        ),
        Mapping(
            "bert/embeddings/LayerNorm/gamma",
            (s + "layernorm_embedding.weight",),
            (D,),
            COPY,
            "encoder",
        ),
        Mapping(
            "bert/embeddings/LayerNorm/beta",
            (s + "layernorm_embedding.bias",),
            (D,),
            COPY,
            "encoder",
        ),
    ]
    if config.type_vocab_size:
        out.append(
            Mapping(
                "bert/embeddings/token_type_embeddings",
                (s + "embed_token_types.weight",),
                (config.type_vocab_size, D),
                COPY,
                "encoder",
            )
        )
    for layer in range(config.num_hidden_layers):
        tf = f"bert/encoder/layer_{layer}/"
        fs = f"{s}layers.{layer}."
        for tf_part, fs_part, in_dim, out_dim in (
            ("attention/self/query", "self_attn.q_proj", D, D),
            ("attention/self/key", "self_attn.k_proj", D, D),
            ("attention/self/value", "self_attn.v_proj", D, D),
            ("attention/output/dense", "self_attn.out_proj", D, D),
            ("intermediate/dense", "fc1", D, F),
            ("output/dense", "fc2", F, D),
        ):
            out.append(
                Mapping(
                    tf + tf_part + "/kernel",
                    (fs + fs_part + ".weight",),
                    (in_dim, out_dim),
                    KERNEL,
                    "encoder",
                )
            )
            out.append(
                Mapping(
                    tf + tf_part + "/bias", (fs + fs_part + ".bias",), (out_dim,), COPY, "encoder"
                )
            )
        for tf_part, fs_part in (
            ("attention/output/LayerNorm", "self_attn_layer_norm"),
            ("output/LayerNorm", "final_layer_norm"),
        ):
            out.append(
                Mapping(tf + tf_part + "/gamma", (fs + fs_part + ".weight",), (D,), COPY, "encoder")
            )
            out.append(
                Mapping(tf + tf_part + "/beta", (fs + fs_part + ".bias",), (D,), COPY, "encoder")
            )
    nsp = f"classification_heads.{NEXT_SENTENCE_HEAD}."
    out += [
        Mapping(
            "bert/pooler/dense/kernel",
            ("encoder.pooler.dense.weight", nsp + "dense.weight"),
            (D, D),
            KERNEL + "; also the dense of the next_sentence head",
            "pooler",
        ),
        Mapping(
            "bert/pooler/dense/bias",
            ("encoder.pooler.dense.bias", nsp + "dense.bias"),
            (D,),
            COPY + "; also the dense of the next_sentence head",
            "pooler",
        ),
        Mapping(
            "cls/predictions/transform/dense/kernel",
            ("encoder.lm_head.dense.weight",),
            (D, D),
            KERNEL,
            "mlm",
        ),
        Mapping(
            "cls/predictions/transform/dense/bias",
            ("encoder.lm_head.dense.bias",),
            (D,),
            COPY,
            "mlm",
        ),
        Mapping(
            "cls/predictions/transform/LayerNorm/gamma",
            ("encoder.lm_head.layer_norm.weight",),
            (D,),
            COPY,
            "mlm",
        ),
        Mapping(
            "cls/predictions/transform/LayerNorm/beta",
            ("encoder.lm_head.layer_norm.bias",),
            (D,),
            COPY,
            "mlm",
        ),
        Mapping(
            "cls/predictions/output_bias",
            ("encoder.lm_head.bias",),
            (V,),
            "permuted from BERT to fairseq vocabulary order",
            "mlm",
        ),
        Mapping(
            "cls/seq_relationship/output_weights",
            (nsp + "out_proj.weight",),
            (2, D),
            "copied (already [out, in])",
            "nsp",
        ),
        Mapping("cls/seq_relationship/output_bias", (nsp + "out_proj.bias",), (2,), COPY, "nsp"),
    ]
    return out


# Variables that are not parameters of the model: (rule, predicate(name, mapped names)).
OPTIMIZER_SLOTS = ("adam_m", "adam_v", "Adam", "Adam_1")
SKIP_RULES: Sequence[Tuple[str, Callable[[str, set], bool]]] = (
    ("global_step (the training step counter)", lambda name, mapped: name == "global_step"),
    (
        "optimizer slots: V/adam_m, V/adam_v (BERT's AdamWeightDecayOptimizer), V/Adam, V/Adam_1 "
        "(tf.train.AdamOptimizer) of a mapped variable V",
        lambda name, mapped: "/" in name
        and name.rsplit("/", 1)[1] in OPTIMIZER_SLOTS
        and name.rsplit("/", 1)[0] in mapped,
    ),
    (
        "Adam's beta1_power, beta2_power accumulators",
        lambda name, mapped: name in ("beta1_power", "beta2_power"),
    ),
)


@dataclasses.dataclass
class VariablePlan:
    """What happens to each variable of one checkpoint."""

    mapped: List[Mapping]
    skipped: Dict[str, str]  # name -> rule
    heads: Tuple[str, ...]  # present heads among "mlm", "nsp"


def plan_variables(
    bundle: TensorBundle, config: BertConfig, skip_patterns: Sequence[str] = ()
) -> VariablePlan:
    """Classify every variable of ``bundle``; raise naming the first that is unknown, missing
    or of the wrong shape."""
    mappings = {m.tf_name: m for m in variable_mappings(config)}
    names = set(bundle.names())
    mapped_names = names & set(mappings)
    skipped: Dict[str, str] = {}
    for name in sorted(names - set(mappings)):
        for rule, applies in SKIP_RULES:
            if applies(name, mapped_names):
                skipped[name] = rule
                break
        else:
            for pattern in skip_patterns:
                if re.fullmatch(pattern, name):
                    skipped[name] = f"--skip-variable {pattern}"
                    break
            else:
                hint = ""
                if name == "bert/embeddings/token_type_embeddings":
                    hint = " (bert_config.json has type_vocab_size 0)"
                elif re.match(r"bert/encoder/layer_\d+/", name):
                    hint = f" (bert_config.json has num_hidden_layers {config.num_hidden_layers})"
                raise BertCheckpointError(
                    f"{bundle.prefix}: unknown variable {name} {list(bundle.entries[name].shape)}"
                    f"{hint}; not a BERT/RealFormer variable, nor an optimizer slot or "
                    "global_step (--skip-variable REGEX skips it)"
                )
    heads = []
    for head, needed in (("mlm", True), ("nsp", False)):
        group = [m.tf_name for m in mappings.values() if m.head == head]
        present = [n for n in group if n in names]
        if present and len(present) < len(group):
            missing = sorted(set(group) - set(present))
            raise BertCheckpointError(
                f"{bundle.prefix}: missing variable {missing[0]} (the checkpoint has other "
                f"variables of the {'MLM' if head == 'mlm' else 'next-sentence'} head)"
            )
        if present:
            heads.append(head)
        elif needed:
            raise BertCheckpointError(
                f"{bundle.prefix}: missing variable {group[0]}: no MLM head (cls/predictions); "
                "a pre-training checkpoint has one"
            )
    for m in mappings.values():
        if m.head in ("encoder", "pooler") and m.tf_name not in names:
            raise BertCheckpointError(f"{bundle.prefix}: missing variable {m.tf_name}")
        if m.tf_name in names:
            entry = bundle.entries[m.tf_name]
            if tuple(entry.shape) != m.shape:
                raise BertCheckpointError(
                    f"{bundle.prefix}: variable {m.tf_name} has shape {list(entry.shape)}, "
                    f"bert_config.json makes it {list(m.shape)}"
                )
            if entry.dtype_name not in ("float32", "float16", "bfloat16", "float64"):
                raise BertCheckpointError(
                    f"{bundle.prefix}: variable {m.tf_name} is {entry.dtype_name}, not floating point"
                )
    return VariablePlan(
        mapped=[m for m in mappings.values() if m.tf_name in names],
        skipped=skipped,
        heads=tuple(heads),
    )


def fairseq_state_dict(
    bundle: TensorBundle, plan: VariablePlan, vocab: WordPieceVocabulary, padding_idx: int
) -> Dict[str, torch.Tensor]:
    """The fairseq parameters (float32) of every mapped variable."""
    state: Dict[str, torch.Tensor] = {}
    for m in plan.mapped:
        value = bundle.tensor(m.tf_name).astype(np.float32)
        if m.how == KERNEL or m.how.startswith(KERNEL):
            value = value.T
        if m.tf_name in ("bert/embeddings/word_embeddings", "cls/predictions/output_bias"):
            value = value[vocab.bert_ids]  # fairseq row f = BERT row bert_ids[f]
        if m.tf_name == "bert/embeddings/position_embeddings":
            rows = np.zeros((value.shape[0] + padding_idx + 1, value.shape[1]), np.float32)
            rows[padding_idx + 1 :] = value
            value = rows
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        for name in m.fairseq_names:
            if name.startswith(f"classification_heads.{NEXT_SENTENCE_HEAD}.") and (
                "nsp" not in plan.heads
            ):
                continue  # the pooler without a next-sentence head
            state[name] = tensor
    return state


# ------------------------------------------------------------------ the fairseq checkpoint


def fairseq_train_args(
    config: BertConfig,
    heads: Sequence[str],
    data_dir: str,
    lowercase: bool,
    residual_attention: bool = True,
) -> List[str]:
    """The ``fairseq-train`` command line (after ``fairseq-train``) of the imported model: a
    ``masked_lm`` run of ``--arch realformer_roberta`` with BERT's options."""
    args = [
        data_dir,
        "--user-dir",
        PLUGIN_DIR,
        "--task",
        "masked_lm",
        "--criterion",
        "masked_lm",
        "--arch",
        "realformer_roberta",
        "--encoder-layers",
        str(config.num_hidden_layers),
        "--encoder-embed-dim",
        str(config.hidden_size),
        "--encoder-ffn-embed-dim",
        str(config.intermediate_size),
        "--encoder-attention-heads",
        str(config.num_attention_heads),
        "--max-positions",
        str(config.max_position_embeddings),
        "--tokens-per-sample",
        str(config.max_position_embeddings),
        "--activation-fn",
        ACTIVATIONS[config.hidden_act.lower()],
        "--pooler-activation-fn",
        "tanh",
        "--dropout",
        str(config.hidden_dropout_prob),
        "--attention-dropout",
        str(config.attention_probs_dropout_prob),
        "--activation-dropout",
        "0.0",
        "--pooler-dropout",
        str(config.hidden_dropout_prob),
        "--layernorm-eps",
        repr(BERT_LAYERNORM_EPS),
        "--type-vocab-size",
        str(config.type_vocab_size),
        "--bert-pooler",
        "--init-type",
        "default",
        "--bpe",
        "wordpiece",
        "--wordpiece-vocab",
        os.path.join(data_dir, "vocab.txt"),
    ]
    # the casing, always explicit: it travels in cfg.bpe of model.pt and in model_args.txt
    args.append("--wordpiece-uncased" if lowercase else "--wordpiece-cased")
    if residual_attention:
        args += [
            "--residual-attention",
            "encoder",
            "--residual-attention-mode",
            "mean" if config.use_running_mean else "sum",
        ]
    else:
        args += ["--residual-attention", "none"]
    return args


MODEL_ARGS_FILE = "model_args.txt"
# fairseq-train flags of the conversion that are not the model's (data, task)
_NOT_MODEL_FLAGS = ("--user-dir", "--task", "--criterion", "--tokens-per-sample")


def model_args(train_args: List[str]) -> List[str]:
    """The model flags of ``train_args`` (``--arch`` and every option of the imported
    model) and its tokenisation (``--bpe wordpiece --wordpiece-vocab OUT_DIR/vocab.txt`` with
    ``--wordpiece-cased`` or ``--wordpiece-uncased``): what a ``fairseq-train --restore-file
    OUT_DIR/model.pt`` command must repeat (the tokenisation too, so that the fine-tuned
    checkpoint knows it), written to ``OUT_DIR/model_args.txt``."""
    out, i = [], 1  # train_args[0] is the data folder
    while i < len(train_args):
        flag = train_args[i]
        takes_value = i + 1 < len(train_args) and not train_args[i + 1].startswith("--")
        if flag not in _NOT_MODEL_FLAGS:
            out += train_args[i : i + (2 if takes_value else 1)]
        i += 2 if takes_value else 1
    return out


def build_fairseq_checkpoint(train_args: List[str], state: Dict[str, torch.Tensor], heads):
    """Parse ``train_args`` as fairseq-train does, build the model, load ``state`` into it
    (strict: every parameter must come from the checkpoint) and return the checkpoint dict and
    the model."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, train_args)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    if "nsp" in heads:
        model.register_classification_head(NEXT_SENTENCE_HEAD, num_classes=2)
    own = model.state_dict()
    state = dict(state)
    for key in MODEL_OWN_KEYS:  # not parameters of the TF model: the fresh model's values
        if key in own:
            state[key] = own[key]
    missing = sorted(k for k in own if k not in state)
    unexpected = sorted(k for k in state if k not in own)
    if missing or unexpected:  # a mapping that disagrees with the model: a bug, never data
        raise BertCheckpointError(
            f"internal: the mapping does not fit the model (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    for key, value in own.items():
        if tuple(value.shape) != tuple(state[key].shape):
            raise BertCheckpointError(
                f"internal: {key} is {tuple(state[key].shape)}, the model has {tuple(value.shape)}"
            )
    model.load_state_dict(state, strict=True, model_cfg=cfg.model)
    checkpoint = {
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": {},
        "optimizer_history": [
            {
                "criterion_name": "MaskedLmLoss",
                "optimizer_name": "none (converted from a TensorFlow checkpoint)",
                "lr_scheduler_state": {"best": None},
                "num_updates": 0,
            }
        ],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
        "last_optimizer_state": None,
    }
    return checkpoint, model


@dataclasses.dataclass
class ConversionResult:
    out_dir: str
    config: BertConfig
    plan: VariablePlan
    lowercase: bool
    seconds: float
    residual_attention: bool = True

    def summary(self) -> str:
        c = self.config
        heads = ["MLM (cls/predictions)"]
        if "nsp" in self.plan.heads:
            heads.append(f"next-sentence (cls/seq_relationship -> head '{NEXT_SENTENCE_HEAD}')")
        skipped = f", {len(self.plan.skipped)} skipped" if self.plan.skipped else ""
        return (
            f"converted {len(self.plan.mapped)} variables{skipped}: {c.num_hidden_layers} layers, "
            f"width {c.hidden_size}, ffn {c.intermediate_size}, {c.num_attention_heads} heads, "
            f"vocabulary {c.vocab_size} ({'uncased' if self.lowercase else 'cased'} WordPiece), "
            f"{c.max_position_embeddings} positions, {c.type_vocab_size} token types, "
            f"residual attention "
            f"{('running ' + ('mean' if c.use_running_mean else 'sum')) if self.residual_attention else 'none (vanilla BERT)'}, "
            f"heads: pooler, {', '.join(heads)} -> {os.path.join(self.out_dir, 'model.pt')} "
            f"({self.seconds:.1f} s)"
        )


# what the importer writes into OUT_DIR, model.pt last (the file that says the import finished)
OUTPUT_FILES = ("dict.txt", "vocab.txt", MODEL_ARGS_FILE, "model.pt")


@contextlib.contextmanager
def output_folder(out_dir: str):
    """A temporary folder next to ``out_dir`` to write the import into. On success it becomes
    ``out_dir`` (absent or empty before), or, where ``out_dir`` already holds other files (the
    downloaded checkpoint, say), its OUTPUT_FILES are moved into it, each whole, model.pt last; on
    an exception it is removed and ``out_dir`` is left as it was."""
    if not os.path.isdir(out_dir) or not os.listdir(out_dir):
        with atomic_directory(out_dir, overwrite=True) as tmp:
            yield tmp
        return
    tmp = tempfile.mkdtemp(dir=os.path.dirname(out_dir), prefix=f".{os.path.basename(out_dir)}.")
    try:
        yield tmp
        for name in OUTPUT_FILES:
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def moved_paths(value, old: str, new: str):
    """``value`` (a checkpoint's config: dicts, lists, strings) with every path under ``old``
    moved under ``new``."""
    if isinstance(value, dict):
        return {k: moved_paths(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [moved_paths(v, old, new) for v in value]
    if isinstance(value, str) and (value == old or value.startswith(old + os.sep)):
        return new + value[len(old) :]
    return value


def convert_checkpoint(
    tf_checkpoint: str,
    bert_config: str,
    vocab_file: str,
    out_dir: str,
    cased: bool = False,
    uncased: bool = False,
    skip_patterns: Sequence[str] = (),
    overwrite: bool = False,
    residual_attention: bool = True,
) -> ConversionResult:
    """Convert and write ``out_dir/{model.pt,dict.txt,vocab.txt}``; see the module docstring."""
    start = time.time()
    config = BertConfig.from_json_file(bert_config)
    vocab = WordPieceVocabulary.from_file(vocab_file)
    if len(vocab) != config.vocab_size:
        raise BertCheckpointError(
            f"{vocab_file} has {len(vocab)} tokens, {bert_config} says vocab_size "
            f"{config.vocab_size}"
        )
    lowercase = resolve_lowercase(vocab.tokens, cased=cased, uncased=uncased)
    bundle = read_bundle(tf_checkpoint)
    plan = plan_variables(bundle, config, skip_patterns)
    for name, rule in plan.skipped.items():
        logger.info("skipped %s: %s", name, rule)
    out_dir = os.path.abspath(out_dir)
    target = os.path.join(out_dir, "model.pt")
    if os.path.exists(target) and not overwrite:
        raise BertCheckpointError(f"{target} exists (pass --overwrite to replace it)")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise BertCheckpointError(f"{out_dir} exists and is not a folder")
    padding_idx = vocab.dictionary.pad()
    state = fairseq_state_dict(bundle, plan, vocab, padding_idx)

    with output_folder(out_dir) as tmp:  # OUT_DIR appears whole or not at all
        vocab.write_fairseq_dict(os.path.join(tmp, "dict.txt"))
        shutil.copyfile(vocab_file, os.path.join(tmp, "vocab.txt"))
        # the model is built where its files are now; its config names where they will be
        build_args = fairseq_train_args(config, plan.heads, tmp, lowercase, residual_attention)
        checkpoint, _ = build_fairseq_checkpoint(build_args, state, plan.heads)
        checkpoint["cfg"] = moved_paths(checkpoint["cfg"], tmp, out_dir)
        train_args = fairseq_train_args(config, plan.heads, out_dir, lowercase, residual_attention)
        write_text_atomic(
            os.path.join(tmp, MODEL_ARGS_FILE), " ".join(model_args(train_args)) + "\n"
        )
        torch.save(checkpoint, os.path.join(tmp, "model.pt"))
    result = ConversionResult(
        out_dir, config, plan, lowercase, time.time() - start, residual_attention
    )
    logger.info(result.summary())
    return result
