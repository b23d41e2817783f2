"""Masked-token accuracy on held-out text with one fixed masking, the metric by which RealFormer
(He, Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747) compares Post-LN, Pre-LN and RealFormer
BERT pre-training.

fairseq's own validation masks the held-out split with the *training* run's ``--seed`` (its
``masked_lm`` task passes ``common.seed`` to ``MaskTokensDataset``), so two runs of different
seeds, or variants run with different seeds, are validated on different masked positions. Here
the held-out split is masked once, by fairseq's own ``masked_lm`` task and ``MaskTokensDataset``
(epoch 1) with a masking seed of its own (``seed``) and the data-bin's instance length, whatever
the checkpoint was trained with; every checkpoint is then scored on exactly those inputs. The
masked inputs and targets are hashed (``fingerprint``): equal fingerprints are equal positions,
replacements and targets.

Accuracy is counted as google-research/bert does (``run_pretraining.py`` ``metric_fn``:
``masked_lm_accuracy`` over the masked positions): the share of masked positions whose arg-max
prediction is the original WordPiece. BERT never masks ``[CLS]`` / ``[SEP]``
(``create_pretraining_data.py``:346-349); fairseq's ``MaskTokensDataset`` may mask ``<s>`` and
``</s>``, whose prediction is trivial, so they are left out of the count (``n_special_masked``
says how many were masked). The frequency baseline is the accuracy of predicting the training
split's most frequent WordPiece at every counted position.
"""

import dataclasses
import hashlib
import logging
import math
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ..errors import RealformerConfigError

logger = logging.getLogger(__name__)

# google-research/bert create_pretraining_data.py:54 (random_seed): the masking seed by default
DEFAULT_MASK_SEED = 12345
# google-research/bert create_pretraining_data.py:60 (masked_lm_prob) and :392-401 (80 % [MASK],
# 10 % kept, 10 % random)
BERT_MASKING = {"mask_prob": 0.15, "leave_unmasked_prob": 0.1, "random_token_prob": 0.1}


class EvalError(RealformerConfigError):
    """A checkpoint or data-bin that cannot be scored; one line."""


@dataclasses.dataclass
class MaskedSet:
    """The held-out split masked once: padded batches of inputs and targets."""

    data_bin: str
    subset: str
    seed: int
    tokens_per_sample: int
    vocab_size: int
    batches: List[Dict[str, torch.Tensor]]
    fingerprint: str
    n_counted: int  # masked positions scored (not <s>, </s>)
    n_special_masked: int
    specials: Sequence[int]

    def target_counts(self) -> Dict[int, int]:
        counts: Dict[int, int] = {}
        for batch in self.batches:
            for token in batch["counted_targets"].tolist():
                counts[token] = counts.get(token, 0) + 1
        return counts


def masked_heldout(
    data_bin: str,
    tokens_per_sample: int,
    seed: int = DEFAULT_MASK_SEED,
    subset: str = "valid",
    batch_size: int = 64,
) -> MaskedSet:
    """Mask ``data_bin``'s ``subset`` as fairseq's ``masked_lm`` task does with BERT's masking,
    ``--sample-break-mode eos`` and ``tokens_per_sample``, with masking ``seed`` (epoch 1)."""
    from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask

    import realformer_fairseq  # noqa: F401  (fairseq patches, as under fairseq-train)

    if not os.path.isfile(os.path.join(data_bin, "dict.txt")):
        raise EvalError(f"{data_bin}: no dict.txt (not a masked_lm data-bin; run prepare.sh)")
    for suffix in ("bin", "idx"):
        if not os.path.isfile(os.path.join(data_bin, f"{subset}.{suffix}")):
            raise EvalError(f"{data_bin}: no {subset}.{suffix} (the held-out split)")
    cfg = MaskedLMConfig(
        data=data_bin,
        sample_break_mode="eos",
        tokens_per_sample=tokens_per_sample,
        seed=seed,
        **BERT_MASKING,
    )
    task = MaskedLMTask.setup_task(cfg)
    task.load_dataset(subset, epoch=1)
    dataset = task.dataset(subset)
    dataset.set_epoch(1)  # what fairseq's valid iterator does (get_batch_iterator(epoch=1))
    dictionary = task.source_dictionary
    specials = (dictionary.bos(), dictionary.eos())
    pad = dictionary.pad()
    digest = hashlib.sha256()
    batches = []
    n_counted = n_special = 0
    for start in range(0, len(dataset), batch_size):
        sample = dataset.collater(
            [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        )
        tokens, target = sample["net_input"]["src_tokens"], sample["target"]
        for row in range(tokens.size(0)):  # padding-free, in item order
            length = int(tokens[row].ne(pad).sum())
            digest.update(tokens[row, :length].numpy().astype(np.int64).tobytes())
            digest.update(target[row, :length].numpy().astype(np.int64).tobytes())
        masked = target.ne(pad)
        special = torch.zeros_like(masked)
        for symbol in specials:
            special |= target.eq(symbol)
        counted = masked & ~special
        n_counted += int(counted.sum())
        n_special += int((masked & special).sum())
        batches.append(
            {
                "src_tokens": tokens,
                "target": target,
                "masked": masked,
                "counted": counted[masked],  # among the masked positions, in order
                "counted_targets": target[counted],
            }
        )
    if n_counted == 0:
        raise EvalError(f"{data_bin} {subset}: no masked position to score")
    return MaskedSet(
        data_bin=data_bin,
        subset=subset,
        seed=seed,
        tokens_per_sample=tokens_per_sample,
        vocab_size=len(dictionary),
        batches=batches,
        fingerprint=digest.hexdigest(),
        n_counted=n_counted,
        n_special_masked=n_special,
        specials=specials,
    )


def frequency_baseline(masked: MaskedSet, most_frequent: int) -> float:
    """Accuracy (%) of predicting the fairseq id ``most_frequent`` at every counted position."""
    hits = sum(int(b["counted_targets"].eq(most_frequent).sum()) for b in masked.batches)
    return 100.0 * hits / masked.n_counted


def checkpoint_updates(state: Dict) -> Optional[int]:
    history = state.get("optimizer_history") or []
    if history and "num_updates" in history[-1]:
        return int(history[-1]["num_updates"])
    return None


def load_model(path: str, masked: MaskedSet):
    """The model of the fairseq checkpoint ``path`` (any ``realformer_roberta`` / ``roberta``
    masked LM) in eval mode, and its update count; one-line errors for a checkpoint that does not
    fit the data-bin's dictionary."""
    from fairseq import tasks

    from ..checkpoint_compat import read_checkpoint  # the one reader: one line, or a traceback

    state = read_checkpoint(path, {"data": masked.data_bin})
    cfg = state["cfg"]
    if cfg.task.get("_name") != "masked_lm":
        raise EvalError(f"{path}: a {cfg.task.get('_name')} checkpoint, not a masked_lm one")
    task = tasks.setup_task(cfg.task)
    if len(task.source_dictionary) != masked.vocab_size:
        raise EvalError(
            f"{path}: trained with {len(task.source_dictionary)} symbols, {masked.data_bin} has "
            f"{masked.vocab_size} (another vocabulary)"
        )
    model = task.build_model(cfg.model)
    embed = model.encoder.sentence_encoder.embed_tokens.num_embeddings
    if embed != masked.vocab_size:
        raise EvalError(
            f"{path}: the model has {embed} token embeddings, {masked.data_bin} has "
            f"{masked.vocab_size} symbols (another vocabulary)"
        )
    model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    model.eval()
    return model, checkpoint_updates(state), cfg


@torch.no_grad()
def score_model(model, masked: MaskedSet, device: str = "cpu") -> Dict:
    """Accuracy (%) and mean cross-entropy (nats) over the counted masked positions."""
    model.to(device)
    correct = 0
    loss = 0.0
    for batch in masked.batches:
        mask = batch["masked"].to(device)
        logits = model(batch["src_tokens"].to(device), masked_tokens=mask)[0].float()
        counted = batch["counted"].to(device)
        targets = batch["target"].to(device)[mask]
        logits, targets = logits[counted], targets[counted]
        correct += int(logits.argmax(-1).eq(targets).sum())
        loss += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
    return {
        "accuracy": 100.0 * correct / masked.n_counted,
        "loss": loss / masked.n_counted,
        "loss_base2": loss / masked.n_counted / math.log(2),
        "n": masked.n_counted,
    }
