"""The SQuAD data-bin: features of SQuAD files in fairseq's binarized format, and what the
``squad`` task, decoding and the hub need beside them.

Layout (``realformer-squad features`` writes it; every file appears whole or not at all)::

    DEST/squad.json               settings (version, casing, pair layout, max_seq_length,
                                  doc_stride, max_query_length), checksums of the vocabulary and
                                  dictionary, one entry per subset (source file, examples,
                                  features, skipped questions)
    DEST/dict.txt, DEST/vocab.txt the model's fairseq dictionary and WordPiece vocabulary
    DEST/{subset}.bin / .idx      the token ids of every window, <s> ... </s> (fairseq's mmap
                                  indexed dataset, as fairseq-preprocess writes it)
    DEST/{subset}.features.npy    one row per window (features.Feature.row(): example, window,
                                  first context piece, pieces, question pieces, separators,
                                  start and end label)
    DEST/{subset}.record.json     contexts with each piece's character span, questions
                                  (decoding reads them)
"""

import hashlib
import json
import os
from typing import Dict, List, Optional

import numpy as np

from ..atomic_files import atomic_output, write_json_atomic
from .features import (
    Feature,
    FeatureSettings,
    SquadDataError,
    SquadSet,
    piece_ids,
    set_from_record,
    set_record,
)

FORMAT = "realformer-squad-features/1"
SETTINGS_FILE = "squad.json"
FEATURE_COLUMNS = 8


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_settings(data_bin: str) -> dict:
    path = os.path.join(data_bin, SETTINGS_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            settings = json.load(fh)
    except FileNotFoundError:
        raise SquadDataError(
            f"{path}: missing (not a SQuAD data-bin: make it with realformer-squad features, "
            "or examples/squad/prepare.sh)"
        ) from None
    except json.JSONDecodeError as err:
        raise SquadDataError(f"{path}: not JSON ({err.msg})") from None
    if settings.get("format") != FORMAT:
        raise SquadDataError(f"{path}: format {settings.get('format')!r}, expected {FORMAT}")
    return settings


def feature_settings(settings: dict) -> FeatureSettings:
    return FeatureSettings(settings["max_seq_length"], settings["doc_stride"],
                           settings["max_query_length"], settings["pair_layout"])  # fmt: skip


def write_subset(data_bin: str, subset: str, squad_set: SquadSet, dictionary) -> Dict[str, int]:
    """``subset``'s token ids, feature table and record (each atomically)."""
    import torch
    from fairseq.data import indexed_dataset

    os.makedirs(data_bin, exist_ok=True)
    prefix = os.path.join(data_bin, subset)
    unknown = 0
    with atomic_output(prefix + ".bin") as bin_tmp:
        builder = indexed_dataset.make_builder(bin_tmp, impl="mmap", vocab_size=len(dictionary))
        for pieces in squad_set.feature_tokens:
            ids = piece_ids(pieces, dictionary)
            unknown += sum(1 for i, p in zip(ids, pieces) if i == dictionary.unk() and p != "<unk>")
            builder.add_item(torch.IntTensor(ids))
        with atomic_output(prefix + ".idx") as idx_tmp:
            builder.finalize(idx_tmp)
    table = np.array([f.row() for f in squad_set.features], dtype=np.int64).reshape(
        -1, FEATURE_COLUMNS
    )
    with atomic_output(prefix + ".features.npy") as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, table)
    write_json_atomic(prefix + ".record.json", set_record(squad_set))
    return {"examples": len(squad_set.examples), "features": len(squad_set.features),
            "skipped": len(squad_set.skipped), "pieces_not_in_dictionary": unknown}  # fmt: skip


def read_source(settings: dict, subset: str) -> dict:
    """The SQuAD file a subset was made from (for scoring), unchanged since (its checksum)."""
    from .features import load_squad_json

    entry = settings["subsets"][subset]
    path = entry["source"]
    if not os.path.isfile(path):
        raise SquadDataError(f"{path}: missing (the SQuAD file subset {subset} was made from)")
    if sha256_of(path) != entry["source_sha256"]:
        raise SquadDataError(
            f"{path}: changed since subset {subset} was made from it (prepare again)"
        )
    return load_squad_json(path)


def read_feature_table(data_bin: str, subset: str) -> np.ndarray:
    path = os.path.join(data_bin, f"{subset}.features.npy")
    try:
        table = np.load(path)
    except FileNotFoundError:
        raise SquadDataError(f"{path}: missing (subset {subset} was not prepared)") from None
    except ValueError as err:
        raise SquadDataError(f"{path}: not a feature table ({err})") from None
    if table.ndim != 2 or table.shape[1] != FEATURE_COLUMNS:
        raise SquadDataError(f"{path}: shape {table.shape}, expected (features, {FEATURE_COLUMNS})")
    return table


def read_subset(data_bin: str, subset: str) -> SquadSet:
    """The examples and features of a prepared subset (for decoding)."""
    path = os.path.join(data_bin, f"{subset}.record.json")
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except FileNotFoundError:
        raise SquadDataError(f"{path}: missing (subset {subset} was not prepared)") from None
    squad_set = set_from_record(record)
    squad_set.features = [
        Feature.from_row(row) for row in read_feature_table(data_bin, subset).tolist()
    ]
    return squad_set


def binarized_sizes(prefix: str) -> np.ndarray:
    """The sequence lengths of a fairseq mmap dataset ``prefix.idx`` whose ``prefix.bin`` holds
    every byte the index points to (the pipelines' check,
    :func:`realformer_pipelines.checks.check_binarized`: fairseq 0.12.3 reads a truncated file
    lazily and fails in the middle of training)."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    from realformer_pipelines.checks import check_binarized
    from realformer_pipelines.errors import InputError

    try:
        check_binarized(prefix + ".idx")
    except InputError as err:  # a SquadDataError: one line under fairseq's commands too
        raise SquadDataError(str(err)) from None
    index = MMapIndexedDataset.Index(prefix + ".idx")
    sizes = np.array(index.sizes, dtype=np.int64)  # a copy: the index's arrays are its mmap's
    del index
    return sizes


def check_data_bin(data_bin: str, subsets: Optional[List[str]] = None) -> dict:
    """The data-bin is complete and consistent: its vocabulary and dictionary are the ones
    recorded, every subset's files exist, and the token file, feature table and record agree in
    windows and lengths. Returns the settings; one line naming the file on a problem."""
    settings = read_settings(data_bin)
    for name, key in (("vocab.txt", "vocab_sha256"), ("dict.txt", "dict_sha256")):
        path = os.path.join(data_bin, name)
        if not os.path.isfile(path):
            raise SquadDataError(f"{path}: missing")
        if sha256_of(path) != settings[key]:
            raise SquadDataError(f"{path}: not the file the features were made with (checksum)")
    for subset in subsets or list(settings["subsets"]):
        if subset not in settings["subsets"]:
            raise SquadDataError(
                f"{data_bin}: no subset {subset} (has {', '.join(settings['subsets'])})"
            )
        prefix = os.path.join(data_bin, subset)
        for ext in (".bin", ".idx", ".features.npy", ".record.json"):
            if not os.path.isfile(prefix + ext):
                raise SquadDataError(f"{prefix + ext}: missing")
        table = read_feature_table(data_bin, subset)
        sizes = binarized_sizes(prefix)
        if len(sizes) != len(table):
            raise SquadDataError(
                f"{prefix}: {len(sizes)} token sequences, {len(table)} feature rows"
            )
        # <s>, question, separators, window, </s>
        lengths = 1 + table[:, 4] + table[:, 5] + table[:, 3] + 1
        if len(table) and not np.array_equal(lengths, sizes):
            bad = int(np.argmax(lengths != sizes))
            raise SquadDataError(
                f"{prefix}: window {bad} has {sizes[bad]} tokens, its feature row says {lengths[bad]}"
            )
        if len(table) and int(sizes.max()) > settings["max_seq_length"]:
            raise SquadDataError(f"{prefix}: a window longer than max_seq_length")
    return settings
