"""fairseq task ``squad``: SQuAD v1.1 / v2.0 span extraction (google-research/bert
``run_squad.py``), the fine-tuning RealFormer (He et al. 2020, arXiv 2012.11747) reports SQuAD
results with.

It reads a SQuAD data-bin (:mod:`realformer_fairseq.squad.data_bin`: windows of
``<s> question </s> context </s>`` as fairseq token ids, the start / end label of each window)
and registers a span head (:class:`~realformer_fairseq.modules.span_head.SpanHead`) on the
encoder-only model; criterion ``squad_span`` trains it. What the features were made with
(SQuAD version, casing, pair layout, ``max_seq_length``, ``doc_stride``, ``max_query_length``)
is read from the data-bin's ``squad.json`` into the task's config, so that it is saved in every
checkpoint; a flag given on the command line that says otherwise stops with one line. The
hub's ``answer(question, context)`` tokenises raw text with the data-bin's ``vocab.txt`` and
these settings.
"""

import contextlib
import dataclasses
import logging
import os
from typing import Optional

import numpy as np
from fairseq.data import (
    Dictionary,
    IdDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    RawLabelDataset,
    RightPadDataset,
    SortDataset,
    data_utils,
)
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II, MISSING, OmegaConf, open_dict

from ..errors import RealformerConfigError, one_line_under_fairseq_commands
from ..squad import data_bin as squad_data_bin
from ..squad.features import FeatureSettings

logger = logging.getLogger(__name__)

# task config field -> the data-bin's squad.json key
DATA_BIN_SETTINGS = {
    "squad_version": "squad_version",
    "casing": "casing",
    "pair_layout": "pair_layout",
    "max_seq_length": "max_seq_length",
    "doc_stride": "doc_stride",
    "max_query_length": "max_query_length",
}


@dataclasses.dataclass
class SquadConfig(FairseqDataclass):
    data: str = dataclasses.field(
        default=MISSING, metadata={"help": "SQuAD data-bin (realformer-squad features)"}
    )
    squad_version: Optional[str] = dataclasses.field(
        default=None, metadata={"help": "1.1 or 2.0 (default: the data-bin's; checked)"}
    )
    casing: Optional[str] = dataclasses.field(
        default=None, metadata={"help": "cased or uncased (default: the data-bin's; checked)"}
    )
    pair_layout: Optional[str] = dataclasses.field(
        default=None,
        metadata={"help": "bert (<s> q </s> c </s>) or roberta (default: the data-bin's)"},
    )
    max_seq_length: Optional[int] = dataclasses.field(
        default=None, metadata={"help": "run_squad.py's max_seq_length (the data-bin's)"}
    )
    doc_stride: Optional[int] = dataclasses.field(
        default=None, metadata={"help": "run_squad.py's doc_stride (the data-bin's)"}
    )
    max_query_length: Optional[int] = dataclasses.field(
        default=None, metadata={"help": "run_squad.py's max_query_length (the data-bin's)"}
    )
    span_head_name: str = dataclasses.field(
        default="squad_span", metadata={"help": "name of the span head"}
    )
    n_best_size: int = dataclasses.field(
        default=20, metadata={"help": "run_squad.py's n_best_size (decoding)"}
    )
    max_answer_length: int = dataclasses.field(
        default=30, metadata={"help": "run_squad.py's max_answer_length in pieces (decoding)"}
    )
    null_score_diff_threshold: float = dataclasses.field(
        default=0.0,
        metadata={"help": "v2.0: answer '' when null score - best span score exceeds this"},
    )
    no_shuffle: bool = False
    seed: int = II("common.seed")


@register_task("squad", dataclass=SquadConfig)
class SquadTask(FairseqTask):
    """SQuAD span extraction over a data-bin of ``realformer-squad features``."""

    def __init__(self, cfg: SquadConfig, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary
        self._tokenizer = None

    @classmethod
    def load_dictionary(cls, filename):
        """fairseq's ``Dictionary.load`` plus ``<mask>``, as ``masked_lm`` and
        ``sentence_prediction`` load it (so that a pre-trained model's embeddings fit)."""
        dictionary = Dictionary.load(filename)
        dictionary.add_symbol("<mask>")
        return dictionary

    @classmethod
    @one_line_under_fairseq_commands
    def setup_task(cls, cfg: SquadConfig, **kwargs):
        settings = squad_data_bin.read_settings(cfg.data)
        with open_dict(cfg) if OmegaConf.is_config(cfg) else contextlib.ExitStack():
            for key, data_key in DATA_BIN_SETTINGS.items():
                recorded = settings[data_key]
                given = getattr(cfg, key)
                if given is None:
                    setattr(cfg, key, recorded)
                elif str(given) != str(recorded):
                    raise RealformerConfigError(
                        f"--{key.replace('_', '-')} {given} (given, or a fine-tuned checkpoint's): "
                        f"the SQuAD data-bin {cfg.data} was made with {recorded}"
                    )
        dictionary = cls.load_dictionary(os.path.join(cfg.data, "dict.txt"))
        logger.info(
            "SQuAD v%s data-bin %s: %s WordPiece, %s pair layout, max_seq_length %d, doc_stride "
            "%d, max_query_length %d; dictionary: %d types",
            cfg.squad_version, cfg.data, cfg.casing, cfg.pair_layout, cfg.max_seq_length,
            cfg.doc_stride, cfg.max_query_length, len(dictionary),
        )  # fmt: skip
        return cls(cfg, dictionary)

    @property
    def version_2_with_negative(self) -> bool:
        return str(self.cfg.squad_version) == "2.0"

    @property
    def feature_settings(self) -> FeatureSettings:
        return FeatureSettings(self.cfg.max_seq_length, self.cfg.doc_stride,
                               self.cfg.max_query_length, self.cfg.pair_layout)  # fmt: skip

    def tokenizer(self):
        """BERT's tokenizer of the data-bin's ``vocab.txt`` with the features' casing."""
        if self._tokenizer is None:
            from ..tf_import.wordpiece import BertTextTokenizer

            self._tokenizer = BertTextTokenizer.from_file(
                os.path.join(self.cfg.data, "vocab.txt"), lowercase=self.cfg.casing == "uncased"
            )
        return self._tokenizer

    @one_line_under_fairseq_commands
    def load_dataset(self, split, combine=False, **kwargs):
        """``split``'s windows (token ids, right-padded) and their start / end labels
        (``target``: batch x 2; -1 in a subset prepared for prediction only)."""
        squad_data_bin.check_data_bin(self.cfg.data, [split])
        tokens = data_utils.load_indexed_dataset(
            os.path.join(self.cfg.data, split), self.dictionary, dataset_impl="mmap"
        )
        table = squad_data_bin.read_feature_table(self.cfg.data, split)
        labels = table[:, 6:8]
        dataset = NestedDictionaryDataset(
            {
                "id": IdDataset(),
                "net_input": {
                    "src_tokens": RightPadDataset(tokens, pad_idx=self.dictionary.pad()),
                    "src_lengths": NumelDataset(tokens, reduce=False),
                },
                "target": RawLabelDataset(labels.tolist()),
                "nsentences": NumSamplesDataset(),
                "ntokens": NumelDataset(tokens, reduce=True),
            },
            sizes=[tokens.sizes],
        )
        if not self.cfg.no_shuffle:
            with data_utils.numpy_seed(self.cfg.seed):
                shuffle = np.random.permutation(len(tokens))
            dataset = SortDataset(dataset, sort_order=[shuffle])
        unlabelled = int((labels[:, 0] < 0).sum())
        logger.info(
            "loaded %s: %d windows%s", split, len(tokens),
            f" ({unlabelled} without answer labels: prepared for prediction)" if unlabelled else "",
        )  # fmt: skip
        self.datasets[split] = dataset
        return dataset

    @one_line_under_fairseq_commands
    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if not hasattr(model, "register_span_head"):
            raise RealformerConfigError(
                f"--task squad needs the plugin's encoder-only model (--arch realformer_roberta, "
                f"realformer_bert_*, postln_bert_*, preln_bert_*), not {type(model).__name__}"
            )
        positions = model.max_positions()
        if positions is not None and self.cfg.max_seq_length > positions:
            raise RealformerConfigError(
                f"the SQuAD data-bin's windows are up to {self.cfg.max_seq_length} tokens, the "
                f"model has {positions} positions (prepare with --max-seq-length {positions})"
            )
        token_types = model.encoder.sentence_encoder.embed_token_types is not None
        if token_types and self.cfg.pair_layout != "bert":
            raise RealformerConfigError(
                f"the model has BERT's token types, which need the bert pair layout "
                f"(<s> q </s> c </s>); the data-bin has {self.cfg.pair_layout}"
            )
        model.register_span_head(self.cfg.span_head_name)
        return model

    def max_positions(self):
        return self.cfg.max_seq_length

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
