"""Predictions of a fine-tuned GLUE checkpoint (examples/glue; RealFormer, He et al. 2020, arXiv
2012.11747): fairseq's ``sentence_prediction`` model on the binarized subsets prepare.sh wrote,
one prediction per example in example order. Library function: it raises InputError and returns
counts; glue_tools.py's commands print."""

import os
from typing import Dict, Sequence

from glue_tasks import Task

from realformer_pipelines.checkpoints import cfg_get, load_checkpoint
from realformer_pipelines.errors import InputError
from realformer_pipelines.files import atomic_write
from realformer_pipelines.model_info import check_data_fits, info_from_state


def predict(
    task_def: Task,
    checkpoint_path: str,
    data_bin: str,
    subsets: Sequence[str],
    out_dir: str,
    batch_size: int,
    cpu: bool,
) -> Dict[str, int]:
    """A fine-tuned checkpoint's predictions on subsets of the data-bin, in example order:
    OUT/{subset}.pred, one line per example (a label string; STS-B: the score on GLUE's 0-5
    scale). Every example gets one: an input longer than the model's positions stops. Returns
    the number of examples predicted per subset."""
    overrides = {"data": os.path.abspath(data_bin)}  # the data-bin given, not the training one
    state = load_checkpoint(checkpoint_path, overrides)
    # data prepared with the tokenisation, casing and dictionary the model was trained with
    check_data_fits(info_from_state(state, checkpoint_path), data_bin)
    trained_on = cfg_get(state["cfg"]["task"], "_name")
    if trained_on != "sentence_prediction":
        raise InputError(
            f"{checkpoint_path}: a {trained_on} checkpoint, not a fine-tuned one "
            "(sentence_prediction): run finetune.sh first"
        )
    import torch
    from fairseq import checkpoint_utils, utils

    use_cuda = torch.cuda.is_available() and not cpu
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint_path], arg_overrides=overrides, state=state
    )
    if os.path.abspath(cfg.task.data) != overrides["data"]:  # what the task reads
        raise InputError(f"internal: the task reads {cfg.task.data}, not {data_bin}")
    del state
    model = models[0].eval()
    if use_cuda:
        model.cuda()
    head = cfg.criterion.classification_head_name
    regression = bool(cfg.criterion.regression_target)
    if regression != task_def.regression:
        raise InputError(f"{checkpoint_path}: regression_target={regression}, {task_def.name} "
                         f"is {'' if task_def.regression else 'not '}a regression task")  # fmt: skip
    if not regression:
        labels = task.label_dictionary
        first = labels.symbols[labels.nspecial : labels.nspecial + len(task_def.labels)]
        if first != list(task_def.labels):  # fairseq's load_dictionary adds <mask> after them
            raise InputError(
                f"{data_bin}/label/dict.txt: labels {' '.join(first)}, not {task_def.name}'s "
                f"{' '.join(task_def.labels)} in that order (prepare the data with prepare.sh)"
            )
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    os.makedirs(out_dir, exist_ok=True)
    counts: Dict[str, int] = {}
    for subset in subsets:
        try:
            task.load_dataset(subset)
        except Exception as err:
            raise InputError(f"{data_bin}: cannot load subset {subset} ({err})") from None
        dataset = task.dataset(subset)
        too_long = [i for i in range(len(dataset)) if dataset.size(i) > max_positions]
        if too_long:
            raise InputError(
                f"{subset}: {len(too_long)} of {len(dataset)} examples are longer than the "
                f"model's {max_positions} positions (first: example {too_long[0]}, "
                f"{dataset.size(too_long[0])} tokens); prepare.sh --max-seq-length N cuts them "
                "as BERT does"
            )
        batches = task.get_batch_iterator(
            dataset=dataset, max_sentences=batch_size, max_positions=max_positions,
            ignore_invalid_inputs=False, required_batch_size_multiple=1, num_workers=0,
        ).next_epoch_itr(shuffle=False)  # fmt: skip
        predictions: Dict[int, str] = {}
        with torch.no_grad():
            for sample in batches:
                if use_cuda:
                    sample = utils.move_to_cuda(sample)
                logits, _ = model(**sample["net_input"], features_only=True,
                                  classification_head_name=head)  # fmt: skip
                for i, row in zip(sample["id"].tolist(), logits.float().cpu()):
                    if regression:
                        predictions[i] = repr(float(row[0]) * task_def.label_range[1])
                    else:
                        symbol = int(row.argmax()) + task.label_dictionary.nspecial
                        predictions[i] = task.label_dictionary[symbol]
        if sorted(predictions) != list(range(len(dataset))):
            raise InputError(f"{subset}: {len(dataset) - len(predictions)} examples not predicted")
        with atomic_write(os.path.join(out_dir, f"{subset}.pred")) as out:
            out.write("".join(predictions[i] + "\n" for i in range(len(dataset))))
        counts[subset] = len(dataset)
    return counts
