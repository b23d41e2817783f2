#!/usr/bin/env python
"""The margins of tests/test_glue.py's end-to-end GLUE run (examples/glue on the translation-pair
task of studies/glue_pairs.py): what the test's exact configuration reaches when the model sees
both sentences, and when it sees only the second one.

RealFormer (He et al. 2020, arXiv 2012.11747) is evaluated on GLUE sentence-pair tasks; the
end-to-end test must fail when the pipeline drops the first sentence. In the task as the study
builds it (``kind="translation"``) a quarter of the negatives have an English second sentence, so
telling the second sentence's language alone scores 75 % and a model that never sees the first
sentence passes a "majority + 15" bar. With ``translation-french`` every second sentence is
French: the second sentence alone says nothing (and, measured here, the tiny model learns nothing
from the pair either); ``same-language`` ("are both sentences in the same language?") needs both
sentences and nothing more (an XOR of the two languages: not learned either); ``any-french`` ("is
one of the two sentences French?") has each sentence alone at most 75 % and both 100 %. This script measures, with the test's sizes, its 300-update
masked_lm pre-training and its 500-update fine-tuning (finetune.sh / evaluate.sh as the test runs
them), the dev and test accuracy of each task with both sentences and with the first sentence
blanked to "." (CONDITIONS).

Resume (``studies.runs``): the pre-training and each fine-tuning leave a ``result.json`` with
their definition (commands, fingerprint of their data and checkpoint); a stored one is reused
only when it is the definition of this script's configuration, otherwise the run's folder is
moved to ``<run>.superseded`` (a WARNING names what differs) and the run is done again.

usage (from the repository root): python -m studies.glue_pairs_margins [--out docs/benchmarks]
"""

import argparse
import json
import time
from pathlib import Path

from . import glue_pairs, runs

# tests/test_glue.py's configuration, written out again here (the test is the reference)
SIZES = {"pretrain": 10000, "train": 4000, "dev": 400, "test": 200}
MLM = argparse.Namespace(layers=2, width=64, ffn=128, heads=2, tokens_per_sample=128,
                         mlm_batch=16, mlm_updates=300, lr=3e-3, warmup=100, max_update=300)  # fmt: skip
FINETUNE = ["--lr", "5e-4", "--max-update", "500", "--warmup", "30", "--log-interval", "100"]
CONDITIONS = [  # (task kind, first sentence blanked, seeds)
    ("translation-french", False, (1, 2, 3)),
    ("translation-french", True, (1, 2)),
    ("translation", False, (1,)),
    ("translation", True, (1,)),
    ("same-language", False, (1, 2, 3)),
    ("any-french", False, (1, 2, 3)),
    ("any-french", True, (1, 2)),
]
SHORT = {"translation-french": "french", "translation": "any"}  # run folders' names
logger = runs.get_logger("glue_pairs_margins")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/glue_pairs_margins"))
    p.add_argument("--out", type=Path, default=runs.REPO_ROOT / "docs" / "benchmarks")
    args = p.parse_args(argv)
    t0 = time.time()
    work = args.work_dir = args.work_dir.resolve()
    glue = runs.REPO_ROOT / "examples" / "glue"
    base = glue_pairs.build_task(runs.DEFAULT_DATA, work / "task-pretrain", SIZES)
    codes, mlm_bin = glue_pairs.prepare_pretraining(base["glue_dir"] / "pretrain.raw", work, 2000)
    save = work / "mlm"
    cmd = glue_pairs.pretrain_command(mlm_bin, save, "realformer_bert_tiny", 1, MLM,
                                      extra=["--residual-attention-mode", "mean"])  # fmt: skip
    pretraining = runs.definition(cmd, runs.data_fingerprint(mlm_bin), args, save)
    if runs.finished(save / "result.json", pretraining) is None:
        runs.claim(save, pretraining)
        runs.run(cmd, save / "train.log")
        runs.write_json(save / "result.json", {"definition": pretraining})
    checkpoint = save / "checkpoint_last.pt"
    results = []
    for kind, blank, seeds in CONDITIONS:
        name = f"{SHORT.get(kind, kind)}{'-blank-first' if blank else ''}"
        task = work / f"task-{name}"
        glue_pairs.build_task(runs.DEFAULT_DATA, task, SIZES, kind=kind, blank_first=blank)
        prep = work / f"prep-{name}"
        runs.run(["bash", glue / "prepare.sh", "--task", "MRPC", "--glue-dir", task, "--bpe-codes",
                  codes, "--dict", mlm_bin / "dict.txt", "--work-dir", prep, "--workers", "1"],
                 work / f"prepare-{name}.log")  # fmt: skip
        for seed in seeds:
            run_dir = work / f"{name}-seed{seed}"
            finetune = ["bash", glue / "finetune.sh", "--task", "MRPC", "--data-bin",
                        prep / "data-bin", "--checkpoint", checkpoint, "--save-dir",
                        run_dir / "ft", "--cpu", *FINETUNE, "--seed", str(seed), "--",
                        "--validate-interval-updates", "100"]  # fmt: skip
            evaluate = ["bash", glue / "evaluate.sh", "--task", "MRPC", "--data-bin",
                        prep / "data-bin", "--checkpoint-dir", run_dir / "ft", "--out-dir",
                        run_dir / "eval", "--cpu"]  # fmt: skip
            data = [prep / "data-bin", task / "test_labels.txt", checkpoint]
            wanted = runs.definition([*finetune, ";", *evaluate], runs.data_fingerprint(data),
                                     args, run_dir)  # fmt: skip
            done = runs.finished(run_dir / "result.json", wanted)
            if done is None:
                runs.claim(run_dir, wanted)
                start = time.time()
                runs.run(finetune, run_dir / "finetune.log")
                runs.run(evaluate, run_dir / "evaluate.log")
                res = json.loads((run_dir / "eval" / "results.dev.json").read_text())
                dev = res["subsets"]["valid"]
                done = {
                    "task": kind, "first_sentence": "blanked" if blank else "seen",
                    "seed": seed, "dev_accuracy": dev["metrics"]["accuracy"],
                    "dev_majority": dev["majority_class"]["metrics"]["accuracy"],
                    "test_accuracy": glue_pairs.test_accuracy(
                        Path(res["test_predictions"]["test"]), task / "test_labels.txt"),
                    "seconds": round(time.time() - start, 1), "definition": wanted,
                }  # fmt: skip
                runs.write_json(run_dir / "result.json", done)
                for ckpt in (run_dir / "ft").glob("*.pt"):
                    ckpt.unlink()
            logger.info("%s", done)
            results.append(done)
    report = {"study": "glue_pairs_margins", "sizes": SIZES, "mlm": vars(MLM),
              "finetune": FINETUNE, "runs": results,
              "fine_tuning_and_evaluation_seconds": round(sum(r["seconds"] for r in results), 1),
              "seconds_this_invocation": round(time.time() - t0, 1),
              "date": time.strftime("%Y-%m-%d"),
              "command": "python -m studies.glue_pairs_margins"}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    runs.write_json(args.out / "glue_pairs_margins.json", report)
    return report


if __name__ == "__main__":
    runs.main_entry("studies.glue_pairs_margins", main)
