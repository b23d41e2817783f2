"""fairseq 0.12 under numpy 1.26 and numpy 2 (issue 35).

What fairseq 0.12.3 asks of numpy that numpy has removed is supplied to the fairseq modules that
ask for it (realformer_fairseq/numpy_compat.py): every ``np.*`` name and keyword in fairseq's
source is resolved here against what the plugin leaves each module, and each supplied line runs
through the command that reaches it (or at function level where no command of this project
does). Checkpoints name numpy's pickling functions under ``numpy.core`` (numpy 1.x) or
``numpy._core`` (numpy 2): real fairseq checkpoints written under each
(tests/data/numpy_checkpoints, made by its make_numpy_checkpoints.py) load under the other
(realformer_fairseq/checkpoint_compat.py).

The expected values below come from numpy's release notes (what each version removed) and
from the fixtures' own training runs, not from the plugin.
"""

import ast
import inspect
import itertools
import math
import pickletools
import re
import sys
import warnings
import zipfile
from pathlib import Path

import fairseq
import fairseq_cli
import numpy
import pytest
import torch
from harness import (
    MLM_COMMON,
    fairseq_train,
    make_mlm_data,
    multi30k_lines,
    preprocess,
    train_translation,
    write_lines,
)

import realformer_fairseq  # noqa: F401 (installs the patches, as --user-dir does)
from realformer_fairseq.checkpoint_compat import fairseq_checkpoint_globals

NUMPY = numpy.lib.NumpyVersion(numpy.__version__)
NUMPY_MAJOR = NUMPY.major
FIXTURES = Path(__file__).resolve().parent / "data" / "numpy_checkpoints"

# what fairseq 0.12.3 (outside fairseq/examples, which fairseq never imports) asks of numpy and
# which numpy removed it: numpy 1.24 expired np.int / np.float (deprecated in 1.20), numpy 2.0
# removed numpy.compat, numpy 2.4 removed percentile's interpolation= (renamed method= in 1.22)
REMOVED_FROM_NUMPY = [
    ("fairseq.data.data_utils", "int", "1.24.0"),  # compute_mask_indices, no_overlap
    ("fairseq.data.data_utils", "percentile(interpolation=)", "2.4.0"),  # get_buckets
    ("fairseq.data.language_pair_dataset", "compat.long", "2.0.0"),
    ("fairseq.data.token_block_dataset", "compat.long", "2.0.0"),
    ("fairseq.modules.dynamic_crf_layer", "float", "1.24.0"),
]
# the one the plugin leaves missing (the branch that names it fails on every numpy: see
# test_span_masking_without_overlap_fails_on_every_numpy)
LEFT_MISSING = {("fairseq.data.data_utils", "int")}


# ---------------------------------------------------------------------------
# every numpy name and keyword in fairseq's source


def fairseq_sources():
    """(module name, path) of every fairseq / fairseq_cli source file but fairseq/examples."""
    for package in (fairseq, fairseq_cli):
        root = Path(package.__file__).resolve().parent
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            if parts[:2] == ("fairseq", "examples"):
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


def numpy_uses(path: Path):
    """(numpy alias, dotted name, keywords passed) of every outermost ``np.a.b`` expression
    (``import numpy as np`` / ``import numpy``) in the file."""
    with warnings.catch_warnings():  # fairseq's invalid escape sequences
        warnings.simplefilter("ignore")
        tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name == "numpy"
    }
    if not aliases:
        return
    inner, keywords = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner.add(id(node.value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            keywords[id(node.func)] = [k.arg for k in node.keywords if k.arg]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        parts, value = [], node
        while isinstance(value, ast.Attribute):
            parts.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in aliases:
            yield value.id, ".".join(reversed(parts)), keywords.get(id(node), [])


def unresolved(namespace, dotted: str, keywords):
    """What of ``namespace.<dotted>(**keywords)`` the namespace lacks: the name, a keyword the
    function does not take (``name(keyword=)``), or ``None``."""
    obj = namespace
    for part in dotted.split("."):
        if not isinstance(obj, type(numpy)):
            return None  # an attribute of a numpy object (np.random.RandomState(...).x)
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return dotted
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):  # ufuncs and C functions: no signature to check
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    names = {p.name for p in parameters}
    missing = [k for k in keywords if k not in names]
    return f"{dotted}({missing[0]}=)" if missing else None


def what_fairseq_lacks(through_the_modules: bool):
    """{(module, what)} fairseq's source asks of numpy that is not there: looked up on each
    loaded module's own ``np`` (what the plugin left it) or on numpy itself."""
    lacking = set()
    for module_name, path in fairseq_sources():
        module = sys.modules.get(module_name)
        for alias, dotted, keywords in numpy_uses(path):
            namespace = numpy
            if through_the_modules and module is not None:
                namespace = getattr(module, alias, numpy)
            what = unresolved(namespace, dotted, keywords)
            if what:
                lacking.add((module_name, what))
    return lacking


def test_the_scan_finds_what_this_numpy_removed():
    """Against numpy itself, the scan finds exactly what numpy's release notes say this numpy
    removed from what fairseq asks (so the next test can fail)."""
    expected = {(m, what) for m, what, removed_in in REMOVED_FROM_NUMPY if NUMPY >= removed_in}
    assert what_fairseq_lacks(through_the_modules=False) == expected


def test_after_the_plugin_fairseq_finds_everything_it_asks_of_numpy():
    assert what_fairseq_lacks(through_the_modules=True) == LEFT_MISSING


def test_numpy_itself_is_unchanged_and_a_stand_in_is_numpys_namespace():
    from fairseq.data import data_utils, language_pair_dataset, token_block_dataset
    from fairseq.modules import dynamic_crf_layer

    assert not hasattr(numpy, "float") and not hasattr(numpy, "int")
    assert hasattr(numpy, "compat") == (NUMPY_MAJOR < 2)
    stand_in = dynamic_crf_layer.np  # a stand-in on every numpy >= 1.24
    assert stand_in is not numpy and stand_in.float is float  # numpy < 1.24: the builtin
    assert stand_in.arange is numpy.arange and stand_in.random is numpy.random
    assert stand_in.testing is numpy.testing  # numpy 2 provides it lazily
    assert stand_in.__version__ == numpy.__version__
    for module in (token_block_dataset, language_pair_dataset):
        if NUMPY_MAJOR < 2:
            assert module.np is numpy and numpy.compat.long is int  # numpy 1.x's own value
        else:
            assert module.np.compat.long is int  # numpy 1.x: numpy/compat/py3k.py, long = int
            assert module.np.zeros is numpy.zeros
    assert (data_utils.np is numpy) == (NUMPY < "2.4.0")


# ---------------------------------------------------------------------------
# each supplied line, through the command that reaches it


def test_masked_lm_with_sample_break_mode_eos_trains(tmp_path):
    """``fairseq-train --task masked_lm --sample-break-mode eos``: TokenBlockDataset's eos
    branch (``np.compat.long``) makes one block per sentence."""
    data_bin = make_mlm_data(tmp_path, n_train=200, n_valid=50)
    out = fairseq_train(
        data_bin, "--task", "masked_lm", "--criterion", "masked_lm",
        "--arch", "realformer_bert_tiny", "--tokens-per-sample", "64",
        "--sample-break-mode", "eos", "--lr", "1e-3", "--warmup-updates", "2",
        "--max-update", "3", "--save-dir", tmp_path / "ck", *MLM_COMMON, "--log-interval", "1",
    )  # fmt: skip
    assert re.search(r"loaded 200 blocks from: \S+/train\b", out), out[-3000:]
    assert re.search(r"loaded 50 blocks from: \S+/valid\b", out), out[-3000:]
    losses = [float(x) for x in re.findall(r"train_inner \| .*? loss=([\d.]+),", out)]
    assert len(losses) == 3 and all(math.isfinite(x) and x > 0 for x in losses)


def lower_percentile_buckets(sizes, num_buckets):
    """fairseq's get_buckets by hand: the sizes at the percentiles 100/N, 200/N, ..., 100 by
    numpy's "lower" method (the element at floor(q/100 * (n-1)) of the sorted sizes)."""
    ordered = sorted(sizes)
    picks = [
        ordered[math.floor(k / num_buckets * (len(ordered) - 1))] for k in range(1, num_buckets + 1)
    ]
    return sorted(set(picks))


def logged_buckets(line: str):
    """The numbers of fairseq's "bucketing source lengths: [...]" (numpy 2 prints
    ``np.int64(12)``, numpy 1.x ``12``)."""
    return [int(x) for x in re.findall(r"\d+", re.sub(r"np\.\w+\(", "", line))]


def test_translation_with_num_batch_buckets_trains_with_fairseqs_buckets(tmp_path):
    """``fairseq-train --task translation --num-batch-buckets 4``: get_buckets (percentile
    ``interpolation=``) and LanguagePairDataset's bucketing (``np.compat.long``)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    splits = {"train": ("train", 0, 300), "valid": ("val", 0, 40), "test": ("val", 40, 20)}
    lengths = {}
    for split, (source, start, n) in splits.items():
        for lang in ("en", "fr"):
            lines = multi30k_lines(lang, source, start, n)
            write_lines(raw / f"{split}.{lang}", lines)
            if lang == "en":
                lengths[split] = [len(line.split()) + 1 for line in lines]  # + </s>
    data_bin = preprocess(raw, tmp_path / "bin")
    out = train_translation(
        data_bin, tmp_path / "ck", max_update=3, extra=["--num-batch-buckets", "4"]
    )
    logged = re.findall(r"bucketing source lengths: (.*)", out)
    assert [logged_buckets(line) for line in logged] == [
        lower_percentile_buckets(lengths["valid"], 4),  # fairseq-train loads valid first
        lower_percentile_buckets(lengths["train"], 4),
    ]
    losses = [float(x) for x in re.findall(r"train_inner \| .*? loss=([\d.]+),", out)]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)


# ---------------------------------------------------------------------------
# function level: lines no command of this project reaches


def test_get_buckets_are_the_lower_percentiles():
    from fairseq.data.data_utils import get_buckets

    sizes = numpy.array([3, 9, 4, 4, 12, 7, 30, 5, 6, 8, 11, 2])
    for n in (1, 3, 4, 7):
        assert get_buckets(sizes, n).tolist() == lower_percentile_buckets(sizes.tolist(), n)


def test_dynamic_crf_log_likelihood_equals_enumeration():
    """fairseq's DynamicCRF (``np.float("inf")`` with targets; fairseq's nacrf_transformer) with
    a beam as wide as the vocabulary: the exact CRF log-likelihood, computed here by
    enumerating every sequence."""
    from fairseq.modules.dynamic_crf_layer import DynamicCRF

    torch.manual_seed(0)
    vocab, length, batch = 4, 3, 2
    crf = DynamicCRF(vocab, low_rank=3, beam_size=vocab)
    emissions = torch.randn(batch, length, vocab, dtype=torch.float64)
    targets = torch.randint(vocab, (batch, length))
    masks = torch.ones(batch, length, dtype=torch.bool)
    crf = crf.double()
    with torch.no_grad():
        got = crf(emissions, targets, masks)
        transition = crf.E1.weight @ crf.E2.weight.T  # M = E1 E2^T (low rank)

        def score(b, seq):
            s = sum(emissions[b, t, y] for t, y in enumerate(seq))
            return s + sum(transition[seq[t - 1], seq[t]] for t in range(1, length))

        for b in range(batch):
            all_scores = torch.stack(
                [score(b, seq) for seq in itertools.product(range(vocab), repeat=length)]
            )
            expected = score(b, targets[b].tolist()) - torch.logsumexp(all_scores, 0)
            # DynamicCRF's logsumexp runs in float32
            assert got[b].item() == pytest.approx(expected.item(), abs=1e-5)


def test_span_masking_without_overlap_fails_on_every_numpy(monkeypatch):
    """fairseq 0.12.3's ``compute_mask_indices(..., no_overlap=True)`` names ``np.int``, and,
    a few lines on, ``Generator.randint``, which no numpy has: supplying ``np.int`` (as the
    plugin does not) only moves the error. No model or command of this project reaches it."""
    from fairseq.data import data_utils

    from realformer_fairseq.numpy_compat import NumpyWithSupplements

    args = dict(shape=(2, 40), padding_mask=None, mask_prob=0.3, mask_length=4)
    assert data_utils.compute_mask_indices(**args).shape == (2, 40)  # the default branch
    with pytest.raises(AttributeError, match="int"):
        data_utils.compute_mask_indices(**args, no_overlap=True, min_space=1)
    monkeypatch.setattr(data_utils, "np", NumpyWithSupplements("numpy", numpy, {"int": int}))
    with pytest.raises(AttributeError, match="Generator' object has no attribute 'randint'"):
        data_utils.compute_mask_indices(**args, no_overlap=True, min_space=1)


# ---------------------------------------------------------------------------
# checkpoints written under numpy 1.x and numpy 2 load under either

# what the fixtures' training runs stored (printed by both runs alike)
BLEU_COUNTS_SUM = [12, 0, 0, 0]
BLEU_TOTALS_SUM = [228, 196, 168, 140]
ACC_AND_F1_BEST = 31.2


def pickled_globals(path: Path):
    """The ``module.name`` of every global a torch checkpoint's pickle names."""
    with zipfile.ZipFile(path) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        data = archive.read(name)
    return {arg.replace(" ", ".") for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


@pytest.mark.parametrize("major", [1, 2])
def test_the_fixtures_name_their_numpys_pickling_functions(major):
    core = "numpy.core" if major == 1 else "numpy._core"
    bleu = pickled_globals(FIXTURES / f"translation_eval_bleu.numpy{major}.pt")
    assert {f"{core}.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype"} <= bleu
    acc = pickled_globals(FIXTURES / f"sentence_prediction_acc_and_f1.numpy{major}.pt")
    assert {f"{core}.multiarray.scalar", "numpy.dtype"} <= acc


def meter(state, aggregator: str, name: str):
    (entry,) = [m for m in state["extra_state"]["metrics"][aggregator] if m[1] == name]
    return entry[3]


@pytest.mark.parametrize("major", [1, 2])
def test_checkpoints_of_either_numpy_load_with_their_numpy_values(major):
    """fairseq's loader (every command's; the plugin wraps it) on a checkpoint written under
    numpy ``major``, on the numpy of this run."""
    from fairseq import checkpoint_utils

    bleu = checkpoint_utils.load_checkpoint_to_cpu(
        str(FIXTURES / f"translation_eval_bleu.numpy{major}.pt")
    )
    counts = meter(bleu, "valid", "_bleu_counts")["sum"]
    assert isinstance(counts, numpy.ndarray) and counts.tolist() == BLEU_COUNTS_SUM
    assert meter(bleu, "valid", "_bleu_totals")["sum"].tolist() == BLEU_TOTALS_SUM
    acc = checkpoint_utils.load_checkpoint_to_cpu(
        str(FIXTURES / f"sentence_prediction_acc_and_f1.numpy{major}.pt")
    )
    best = acc["extra_state"]["best"]
    assert type(best) is numpy.float64 and best == pytest.approx(ACC_AND_F1_BEST)


@pytest.mark.parametrize("major", [1, 2])
def test_a_model_from_either_numpy_is_built_and_translates(major):
    """What fairseq-generate / -interactive do with the checkpoint: model and task built from
    it (dictionaries beside the fixture), one sentence decoded."""
    from fairseq import checkpoint_utils

    path = FIXTURES / f"translation_eval_bleu.numpy{major}.pt"
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)],
        arg_overrides={"data": str(FIXTURES), "source_lang": "src", "target_lang": "tgt"},
    )
    generator = task.build_generator(models, task.cfg)
    src = task.source_dictionary.encode_line("the red dog runs", add_if_not_exist=False)
    sample = {"net_input": {"src_tokens": src[None].long(), "src_lengths": torch.tensor([4 + 1])}}
    hypos = task.inference_step(generator, models, sample)
    assert hypos[0][0]["tokens"][-1].item() == task.target_dictionary.eos()


def test_numpy_1_and_numpy_2_trained_the_same_weights():
    """The two fixtures' runs (same commands and seed; numpy 1.26.4 and 2.4.6) wrote equal
    weights: nothing numpy does in fairseq's training changed between the versions."""
    from fairseq import checkpoint_utils

    for name in ("translation_eval_bleu", "sentence_prediction_acc_and_f1"):
        one, two = (
            checkpoint_utils.load_checkpoint_to_cpu(str(FIXTURES / f"{name}.numpy{m}.pt"))
            for m in (1, 2)
        )
        assert one["model"].keys() == two["model"].keys()
        for key in one["model"]:
            assert torch.equal(one["model"][key], two["model"][key]), (name, key)


def test_without_the_other_spelling_the_other_numpys_checkpoint_is_refused():
    """The allow-list as it was (numpy's functions under the running numpy's own module
    names only) refuses the checkpoint of the other numpy: the fixtures exercise that path."""
    other = 1 if NUMPY_MAJOR >= 2 else 2
    own_names_only = [g[0] if isinstance(g, tuple) else g for g in fairseq_checkpoint_globals()]
    other_core = "numpy.core" if other == 1 else "numpy._core"
    for name in ("translation_eval_bleu", "sentence_prediction_acc_and_f1"):
        with torch.serialization.safe_globals(own_names_only):
            with pytest.raises(Exception, match=re.escape(f"{other_core}.multiarray.")):
                torch.load(FIXTURES / f"{name}.numpy{other}.pt", weights_only=True)
