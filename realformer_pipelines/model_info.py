"""What a model knows, read from the model itself: the one function every pipeline step uses
to learn a checkpoint's tokenisation (tokenizer kind, casing, vocabulary files), its fairseq
dictionary and how it reads a sentence pair.

A step that prepares, fine-tunes or evaluates data for a model never asks the user what the
model was trained with: it asks :func:`read_model_info`, and a flag the user gives that
contradicts the answer stops with one line (:func:`check_agrees`). The facts come from the
checkpoint's config, as fairseq stores it:

* tokenizer and casing: ``cfg.bpe`` (``--bpe wordpiece --wordpiece-vocab V`` with
  ``--wordpiece-cased`` or ``--wordpiece-uncased``, which ``realformer-import-tf`` writes into
  ``model.pt`` and ``examples/glue/finetune.sh`` repeats when fine-tuning, read by the plugin's
  one rule, ``realformer_pipelines.vocabulary.wordpiece_lowercase``: without either flag,
  as the vocabulary shows; ``--bpe subword_nmt --bpe-codes C``; ``--bpe sentencepiece``); a
  model without ``--bpe`` has tokenizer ``""`` (unknown) and casing ``None``, and subword-nmt
  casing ``None`` (the codes keep the case of whatever text they were learned on);
* pair layout: BERT's ``[CLS] a [SEP] b [SEP]`` with token types (``bert``) for a model with
  token types (``--type-vocab-size`` > 0: Google's checkpoints, pre-trained on such pairs), else
  RoBERTa's ``<s> a </s></s> b </s>`` (``roberta``); a fine-tuned ``sentence_prediction``
  checkpoint says it itself (``--separator-token`` given: roberta, absent: bert). A model of
  neither kind (``masked_lm`` on single segments) has ``roberta`` but
  ``pair_layout_known=False``: a user may choose the other;
* vocabulary and dictionary files: the paths the checkpoint records (``wordpiece_vocab``,
  ``bpe_codes``, ``task.data``/``dict.txt``) where they exist, else the same file names next
  to the checkpoint (a model folder that was moved or copied).

``path`` is a checkpoint file or a model folder (``realformer-import-tf``'s OUT_DIR, holding
``model.pt``, ``vocab.txt``, ``dict.txt``).
"""

import dataclasses
import os
import shlex
from typing import List, Optional

from .checkpoints import cfg_get, load_checkpoint
from .errors import InputError

# fairseq's --bpe names -> the pipelines' tokenizer names
TOKENIZERS = {"wordpiece": "wordpiece", "subword_nmt": "subword-nmt",
              "sentencepiece": "sentencepiece", "gpt2": "gpt2", "bert": "wordpiece"}  # fmt: skip
PAIR_LAYOUTS = ("bert", "roberta")
MODEL_FILE = "model.pt"  # the checkpoint of a model folder


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    checkpoint: str  # the checkpoint file read
    arch: str
    task: str  # the task it was trained with (masked_lm, sentence_prediction, ...)
    tokenizer: str  # wordpiece, subword-nmt, sentencepiece, gpt2; "" when the model does not say
    cased: Optional[bool]  # None when the model does not say (subword-nmt keeps its data's case)
    pair_layout: str  # bert or roberta
    vocab: Optional[str]  # wordpiece: vocab.txt; subword-nmt: the codes; sentencepiece: .model
    dictionary: Optional[str]  # the fairseq dict.txt of its embeddings
    type_vocab_size: int
    pair_layout_known: bool = True  # False: no pairs in its training (a choice, not a fact)
    max_positions: Optional[int] = None  # its position embeddings (None: not in its config)

    def bpe_flags(self) -> List[str]:
        """The fairseq flags of its tokenisation (``--bpe ...``), for a command that trains
        from it (the next checkpoint then knows it too); [] when unknown."""
        if self.tokenizer == "wordpiece" and self.vocab and self.cased is not None:
            case = "--wordpiece-cased" if self.cased else "--wordpiece-uncased"
            return ["--bpe", "wordpiece", "--wordpiece-vocab", self.vocab, case]
        if self.tokenizer == "subword-nmt" and self.vocab:
            return ["--bpe", "subword_nmt", "--bpe-codes", self.vocab]
        if self.tokenizer == "sentencepiece" and self.vocab:
            return ["--bpe", "sentencepiece", "--sentencepiece-model", self.vocab]
        return []

    @property
    def casing(self) -> str:
        return {True: "cased", False: "uncased", None: "unknown"}[self.cased]

    def shell(self) -> str:
        """bash assignments: MODEL_TOKENIZER, MODEL_CASED (1, 0 or empty), MODEL_PAIR_LAYOUT,
        MODEL_VOCAB, MODEL_DICT, MODEL_MAX_POSITIONS (empty when unknown), MODEL_CHECKPOINT,
        and the array MODEL_BPE_FLAGS (bpe_flags)."""
        cased = {True: "1", False: "0", None: ""}[self.cased]
        values = {
            "MODEL_CHECKPOINT": self.checkpoint,
            "MODEL_TOKENIZER": self.tokenizer,
            "MODEL_CASED": cased,
            "MODEL_PAIR_LAYOUT": self.pair_layout,
            "MODEL_VOCAB": self.vocab or "",
            "MODEL_DICT": self.dictionary or "",
            "MODEL_MAX_POSITIONS": str(self.max_positions or ""),
        }
        lines = [f"{k}={shlex.quote(v)}" for k, v in values.items()]
        lines.append("MODEL_BPE_FLAGS=(" + " ".join(map(shlex.quote, self.bpe_flags())) + ")")
        return "\n".join(lines)

    def summary(self) -> str:
        tokenizer = self.tokenizer or "unknown tokenizer"
        return (
            f"{tokenizer}, {self.casing}, {self.pair_layout} pair layout"
            + (f", vocabulary {self.vocab}" if self.vocab else "")
            + (f", dictionary {self.dictionary}" if self.dictionary else "")
        )


def model_checkpoint(path: str) -> str:
    """The checkpoint file of ``path`` (a file, or a model folder's ``model.pt``)."""
    if os.path.isdir(path):
        candidate = os.path.join(path, MODEL_FILE)
        if not os.path.isfile(candidate):
            raise InputError(f"{path}: a folder without {MODEL_FILE} (not a model folder)")
        return candidate
    if not os.path.isfile(path):
        raise InputError(f"{path}: missing model (a checkpoint file or a model folder)")
    return path


def _existing(recorded: Optional[str], checkpoint: str, name: Optional[str] = None):
    """``recorded`` if that file exists, else the file of that name (or ``name``) next to the
    checkpoint, else None."""
    if recorded and os.path.isfile(recorded):
        return os.path.abspath(recorded)
    base = name or (os.path.basename(recorded) if recorded else None)
    if base:
        sibling = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), base)
        if os.path.isfile(sibling):
            return sibling
    return None


def info_from_state(state: dict, checkpoint: str) -> ModelInfo:
    """:class:`ModelInfo` of a loaded checkpoint (``state`` as fairseq loads it)."""
    cfg = state.get("cfg") or {}
    model_cfg, task_cfg, bpe_cfg = (cfg_get(cfg, k) for k in ("model", "task", "bpe"))
    arch = cfg_get(model_cfg, "arch") or cfg_get(model_cfg, "_name") or ""
    task = cfg_get(task_cfg, "_name") or ""
    bpe = cfg_get(bpe_cfg, "_name") or ""
    tokenizer = TOKENIZERS.get(bpe, bpe)
    cased, vocab = None, None
    if bpe == "wordpiece":
        from .vocabulary import read_vocab_file, wordpiece_lowercase

        vocab = _existing(cfg_get(bpe_cfg, "wordpiece_vocab"), checkpoint, "vocab.txt")
        said = cfg_get(bpe_cfg, "wordpiece_cased") is not None or cfg_get(
            bpe_cfg, "wordpiece_uncased", False
        )
        if vocab or said:  # without either, nothing says
            lowercase, _ = wordpiece_lowercase(bpe_cfg, read_vocab_file(vocab) if vocab else [])
            cased = not lowercase
    elif bpe == "subword_nmt":
        vocab = _existing(cfg_get(bpe_cfg, "bpe_codes"), checkpoint, "bpecodes")
    elif bpe == "sentencepiece":
        vocab = _existing(cfg_get(bpe_cfg, "sentencepiece_model"), checkpoint)
    type_vocab_size = int(cfg_get(model_cfg, "type_vocab_size", 0) or 0)
    pair_layout_known = True
    if task == "sentence_prediction":
        separator = cfg_get(task_cfg, "separator_token")
        pair_layout = "roberta" if separator is not None else "bert"
    else:
        pair_layout = "bert" if type_vocab_size > 0 else "roberta"
        pair_layout_known = type_vocab_size > 0
    data = cfg_get(task_cfg, "data") or ""
    data = str(data).split(os.pathsep)[0] if data else ""
    dictionary = None
    for recorded in (os.path.join(data, "dict.txt"), os.path.join(data, "input0", "dict.txt")):
        if data and os.path.isfile(recorded):
            dictionary = os.path.abspath(recorded)
            break
    dictionary = dictionary or _existing(None, checkpoint, "dict.txt")
    max_positions = cfg_get(model_cfg, "max_positions")
    return ModelInfo(os.path.abspath(checkpoint), str(arch), str(task), tokenizer, cased,
                     pair_layout, vocab, dictionary, type_vocab_size, pair_layout_known,
                     int(max_positions) if max_positions else None)  # fmt: skip


def read_model_info(path: str) -> ModelInfo:
    """What the model at ``path`` (a checkpoint, or a model folder) knows; see the module
    docstring. An unreadable model is an :class:`InputError`."""
    checkpoint = model_checkpoint(path)
    return info_from_state(load_checkpoint(checkpoint), checkpoint)


def vocabulary_info(vocab: str, cased: Optional[bool] = None) -> ModelInfo:
    """What a bare WordPiece ``vocab.txt`` says when no model comes with it: casing ``cased``
    when given, else as the vocabulary shows (the plugin's rule); its dictionary the
    ``dict.txt`` next to it; the pair layout is a choice (``pair_layout_known=False``)."""
    if not os.path.isfile(vocab):
        raise InputError(f"{vocab}: missing vocabulary file")
    if cased is None:
        from .vocabulary import lowercase_of_vocabulary, read_vocab_file

        cased = not lowercase_of_vocabulary(read_vocab_file(vocab))[0]
    dictionary = _existing(None, vocab, "dict.txt")
    return ModelInfo("", "", "", "wordpiece", cased, "bert", os.path.abspath(vocab), dictionary,
                     0, pair_layout_known=False)  # fmt: skip


def check_agrees(
    info: ModelInfo,
    cased: Optional[bool] = None,
    tokenizer: Optional[str] = None,
    pair_layout: Optional[str] = None,
    flags: str = "",
):
    """A user's explicit choice (None: not given) that contradicts what the model knows stops
    with one line; one the model does not know is left to the user. ``flags``: how the user
    spelled the choices, for the message (e.g. ``--uncased``)."""
    where = f"the model {info.checkpoint}"
    given = f"{flags}: " if flags else ""
    if tokenizer is not None and info.tokenizer and tokenizer != info.tokenizer:
        raise InputError(f"{given}{where} was trained with {info.tokenizer}, not {tokenizer}")
    if cased is not None and info.cased is not None and cased != info.cased:
        raise InputError(
            f"{given}{where} is {info.casing} (its --bpe {info.tokenizer} settings); leave the "
            "flag out to use the model's"
        )
    if pair_layout is not None and pair_layout not in PAIR_LAYOUTS:
        raise InputError(
            f"pair layout must be one of {', '.join(PAIR_LAYOUTS)}, got '{pair_layout}'"
        )
    if pair_layout is not None and pair_layout != info.pair_layout and info.pair_layout_known:
        raise InputError(
            f"{given}{where} reads sentence pairs in the {info.pair_layout} layout, not "
            f"{pair_layout}; leave the flag out to use the model's"
        )


PREPARE_ENV = "prepare.env"  # what a pipeline's prepare step records in its data-bin


def read_prepare_env(data_bin: str) -> dict:
    """``DATA_BIN/prepare.env`` (KEY=VALUE lines, as the pipelines' prepare.sh write it); {}
    when there is none."""
    path = os.path.join(data_bin, PREPARE_ENV)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return dict(line.rstrip("\n").split("=", 1) for line in fh if "=" in line)


def _sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def check_data_fits(info: ModelInfo, data_bin: str):
    """The data-bin was prepared as the model was trained: the same tokenizer, casing and
    dictionary (what its ``prepare.env`` records: TOKENIZER, CASED, DICT_SHA256); a mismatch
    stops with one line. Facts that either side does not record are not compared."""
    env = read_prepare_env(data_bin)
    again = f"prepare it again for this model (prepare.sh --model {info.checkpoint})"
    tokenizer = env.get("TOKENIZER", "")
    if tokenizer and info.tokenizer and tokenizer != info.tokenizer:
        raise InputError(
            f"{data_bin} was prepared with {tokenizer}, the model {info.checkpoint} was trained "
            f"with {info.tokenizer}: {again}"
        )
    if tokenizer == "wordpiece" and env.get("CASED") in ("0", "1") and info.cased is not None:
        data_cased = env["CASED"] == "1"
        if data_cased != info.cased:
            raise InputError(
                f"{data_bin} was prepared {'cased' if data_cased else 'uncased'}, the model "
                f"{info.checkpoint} is {info.casing}: {again}"
            )
    digest = env.get("DICT_SHA256", "")
    if digest and info.dictionary and _sha256(info.dictionary) != digest:
        raise InputError(
            f"{data_bin} was prepared with another dictionary than the model's "
            f"({info.dictionary}): {again}"
        )
