"""Start / end logits of a fine-tuned ``squad`` model and BERT's answers from them: for a
prepared subset (``realformer-squad predict``, examples/squad/evaluate.sh) and for one question
about one context given as raw text (the hub's ``answer``)."""

import json
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..atomic_files import write_json_atomic, write_text_atomic
from . import data_bin as squad_data_bin
from .decoding import decode
from .features import SquadSet, example_features, piece_ids

logger = logging.getLogger(__name__)

Logits = Dict[int, Tuple[List[float], List[float]]]


def logits_of_batch(model, head: str, src_tokens: torch.Tensor, lengths: Sequence[int]):
    """Each row's start and end logits over its real tokens (floats, padding left out)."""
    (start, end), _ = model(src_tokens, span_head_name=head)
    start, end = start.float().cpu(), end.float().cpu()
    return [(start[i, :n].tolist(), end[i, :n].tolist()) for i, n in enumerate(lengths)]


def subset_logits(model, task, subset: str, batch_size: int, use_cuda: bool) -> Logits:
    """The logits of every window of a prepared subset, by feature index."""
    from fairseq import utils

    task.load_dataset(subset)
    dataset = task.dataset(subset)
    batches = task.get_batch_iterator(
        dataset=dataset, max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=False, required_batch_size_multiple=1, num_workers=0,
    ).next_epoch_itr(shuffle=False)  # fmt: skip
    out: Logits = {}
    with torch.no_grad():
        for sample in batches:
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            src = sample["net_input"]["src_tokens"]
            lengths = sample["net_input"]["src_lengths"].tolist()
            rows = logits_of_batch(model, task.cfg.span_head_name, src, lengths)
            for i, row in zip(sample["id"].tolist(), rows):
                out[i] = row
    if len(out) != len(dataset):
        raise RuntimeError(f"{subset}: {len(dataset) - len(out)} windows not predicted")
    return out


def write_prediction_files(out_dir: str, predictions, nbest, null_odds, with_negative: bool):
    """run_squad.py's files: predictions.json, nbest_predictions.json and (v2.0)
    null_odds.json, ``json.dumps(..., indent=4)`` as it writes them."""
    os.makedirs(out_dir, exist_ok=True)
    files = {"predictions.json": predictions, "nbest_predictions.json": nbest}
    if with_negative:
        files["null_odds.json"] = null_odds
    for name, obj in files.items():
        write_text_atomic(os.path.join(out_dir, name), json.dumps(obj, indent=4) + "\n")
    return [os.path.join(out_dir, name) for name in files]


def predict_subset(
    checkpoint: str,
    data_bin: str,
    subset: str,
    out_dir: str,
    batch_size: int = 64,
    cpu: bool = False,
    n_best_size: Optional[int] = None,
    max_answer_length: Optional[int] = None,
    null_score_diff_threshold: Optional[float] = None,
    score: bool = False,
    tune_threshold: bool = False,
) -> dict:
    """A fine-tuned checkpoint's answers to a prepared subset of ``data_bin`` (the data-bin
    given, whatever the checkpoint was trained on), written in run_squad.py's formats into
    ``out_dir``. With ``score``: scored by the official rules against the subset's SQuAD file
    (``out_dir/scores.json``); with ``tune_threshold`` (v2.0) also answered again with the
    official ``best_f1_thresh`` as the null threshold (BERT's README) into
    ``out_dir/best_f1_thresh/``. Returns what scores.json holds."""
    from fairseq import checkpoint_utils

    from ..errors import RealformerConfigError

    data_settings = squad_data_bin.check_data_bin(data_bin, [subset])
    data_bin = os.path.abspath(data_bin)
    if score:
        source = data_settings["subsets"][subset]["source"]
        gold = squad_data_bin.read_source(data_settings, subset)
    overrides = {"data": data_bin}  # the data-bin given, not the one it was trained on
    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint, arg_overrides=overrides)
    task_name = state["cfg"]["task"]["_name"]
    if task_name != "squad":
        raise RealformerConfigError(
            f"{checkpoint} is a {task_name} checkpoint, not a fine-tuned SQuAD one (task squad)"
        )
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides=overrides, state=state
    )
    if os.path.abspath(task.cfg.data) != data_bin:  # fairseq drops arg_overrides given a state
        raise RuntimeError(f"internal: the task reads {task.cfg.data}, not {data_bin}")
    del state
    model = models[0].eval()
    use_cuda = torch.cuda.is_available() and not cpu
    if use_cuda:
        model.cuda()
    logits = subset_logits(model, task, subset, batch_size, use_cuda)
    squad_set = squad_data_bin.read_subset(data_bin, subset)
    settings = dict(
        n_best_size=task.cfg.n_best_size if n_best_size is None else n_best_size,
        max_answer_length=task.cfg.max_answer_length if max_answer_length is None else max_answer_length,
        null_score_diff_threshold=(task.cfg.null_score_diff_threshold
                                   if null_score_diff_threshold is None else null_score_diff_threshold),
    )  # fmt: skip
    with_negative = task.version_2_with_negative
    predictions, nbest, null_odds = decode(
        squad_set, logits, version_2_with_negative=with_negative, **settings
    )
    files = write_prediction_files(out_dir, predictions, nbest, null_odds, with_negative)
    logger.info("%s: answered %d questions of %s (%d windows) into %s", checkpoint,
                len(predictions), subset, len(logits), out_dir)  # fmt: skip
    results = {"checkpoint": os.path.abspath(checkpoint), "data_bin": data_bin, "subset": subset,
               "squad_version": str(task.cfg.squad_version), "files": files}  # fmt: skip
    if not score:
        return results
    from .evaluation import evaluate

    results["data"] = source
    na = null_odds if with_negative else None
    results["runs"] = [{"null_score_diff_threshold": settings["null_score_diff_threshold"],
                        "dir": os.path.abspath(out_dir),
                        "scores": evaluate(gold["data"], predictions, na, data_path=source,
                                           pred_path=files[0])}]  # fmt: skip
    if tune_threshold and with_negative:
        best = results["runs"][0]["scores"]["best_f1_thresh"]
        settings["null_score_diff_threshold"] = best
        predictions, nbest, null_odds = decode(squad_set, logits, version_2_with_negative=True,
                                               **settings)  # fmt: skip
        tuned_dir = os.path.join(out_dir, "best_f1_thresh")
        tuned = write_prediction_files(tuned_dir, predictions, nbest, null_odds, True)
        results["runs"].append({"null_score_diff_threshold": best, "dir": os.path.abspath(tuned_dir),
                                "chosen_by": "best_f1_thresh of the run above (BERT's README)",
                                "scores": evaluate(gold["data"], predictions, null_odds,
                                                   data_path=source, pred_path=tuned[0])})  # fmt: skip
    write_json_atomic(os.path.join(out_dir, "scores.json"), results)
    return results


def answer(hub, question: str, context: str, n_best_size: Optional[int] = None,
           max_answer_length: Optional[int] = None,
           null_score_diff_threshold: Optional[float] = None) -> dict:  # fmt: skip
    """One question about one context, raw text, answered as run_squad.py answers (the hub's
    ``answer``): ``{"text", "start", "end", "null_odds", "nbest"}`` with ``start`` / ``end``
    the answer's character span in ``context`` (None for no answer) and ``null_odds`` the
    v2.0 null score minus the best span's (None for v1.1)."""
    from fairseq.data import data_utils

    from ..errors import RealformerConfigError

    task = hub.task
    if not hasattr(task, "feature_settings"):
        raise RealformerConfigError(
            f"answer() needs a model fine-tuned with --task squad; this one has task "
            f"{type(task).__name__}"
        )
    squad_set: SquadSet = example_features(
        question, context, task.tokenizer(), task.feature_settings
    )
    squad_set.version_2_with_negative = task.version_2_with_negative
    dictionary = task.source_dictionary
    rows = [torch.LongTensor(piece_ids(t, dictionary)) for t in squad_set.feature_tokens]
    src = data_utils.collate_tokens(rows, dictionary.pad()).to(hub.device)
    model = hub.model
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            per_row = logits_of_batch(model, task.cfg.span_head_name, src, [len(r) for r in rows])
    finally:
        model.train(training)
    cfg = task.cfg
    predictions, nbest, null_odds = decode(
        squad_set, dict(enumerate(per_row)),
        n_best_size=cfg.n_best_size if n_best_size is None else n_best_size,
        max_answer_length=cfg.max_answer_length if max_answer_length is None else max_answer_length,
        null_score_diff_threshold=(cfg.null_score_diff_threshold
                                   if null_score_diff_threshold is None else null_score_diff_threshold),
        with_offsets=True,
    )  # fmt: skip
    text = predictions["0"]
    span = next((e["offsets"] for e in nbest["0"] if e["text"] == text and text), None)
    return {
        "text": text,
        "start": span[0] if span else None,
        "end": span[1] if span else None,
        "null_odds": null_odds.get("0"),
        "nbest": [dict(entry) for entry in nbest["0"]],
    }
