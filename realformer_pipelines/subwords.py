"""Subword segmentation of the pipelines: subword-nmt (Sennrich et al.'s BPE, as fairseq's
``prepare-wmt14en2fr.sh``: ``learn-bpe -s N`` on train.en + train.fr, then ``apply-bpe``) and
sentencepiece BPE (the WMT'14 pipeline's ``--bpe sentencepiece`` option). The outputs equal what
subword-nmt's own command line writes (tests/test_pipeline.py); progress is logged."""

import contextlib
import os
import shutil
import tempfile
from typing import Sequence

from .checks import count_lines_utf8
from .errors import InputError
from .files import atomic_write, read_lines
from .log import Progress, bar_on_stderr, progress_lines

_WORKER = {}


class _CountingWriter:
    """The code file learn_bpe writes to: counts the merges (one line each) for the log."""

    def __init__(self, out, progress: Progress):
        self.out, self.progress = out, progress

    def write(self, text: str):
        self.out.write(text)
        if not text.startswith("#version"):
            self.progress.update(text.count("\n"))


def learn_bpe(inputs: Sequence[str], output: str, symbols: int):
    """subword-nmt learn-bpe -s ``symbols`` on the concatenation of ``inputs``, in the given
    order (the reference: train.en then train.fr), with progress lines for reading and merging."""
    from subword_nmt.learn_bpe import learn_bpe as subword_nmt_learn_bpe

    for path in inputs:
        count_lines_utf8(path)
    reading = Progress(f"learn-bpe read {'+'.join(os.path.basename(p) for p in inputs)}")

    def lines():
        for path in inputs:
            with open(path, encoding="utf-8", newline="\n") as fh:
                yield from progress_lines(fh, reading)
        reading.done()

    # subword-nmt's merge bar only on a terminal; otherwise the periodic lines of `merging`
    bar = bar_on_stderr()
    merging = Progress("learn-bpe", unit="merges", periodic=not bar)
    with atomic_write(output) as out, _merge_bar(bar):
        subword_nmt_learn_bpe(lines(), _CountingWriter(out, merging), symbols)
    merging.done()


@contextlib.contextmanager
def _merge_bar(show: bool):
    """subword_nmt.learn_bpe's ``tqdm`` (its merge loop's bar), disabled unless ``show``,
    for the duration of one call; put back afterwards."""
    import subword_nmt.learn_bpe as module

    original = module.tqdm

    def tqdm(iterable, *args, **kwargs):
        return original(iterable, *args, **kwargs) if show else iterable

    module.tqdm = tqdm
    try:
        yield
    finally:
        module.tqdm = original


def _init_bpe(codes: str):
    from subword_nmt.apply_bpe import BPE

    with open(codes, encoding="utf-8") as fh:
        _WORKER["bpe"] = BPE(fh)


def _apply_bpe_line(line: str) -> str:
    return _WORKER["bpe"].process_line(line)


def apply_bpe(codes: str, input_path: str, output_path: str, workers: int = 1):
    """subword-nmt apply-bpe -c ``codes`` (default separator @@, all merges), with progress."""
    count_lines_utf8(codes)
    count_lines_utf8(input_path)
    progress = Progress(f"apply-bpe {os.path.basename(input_path)}")
    with open(input_path, encoding="utf-8", newline="\n") as fh, atomic_write(output_path) as out:
        lines = progress_lines(fh, progress)
        if workers > 1:
            import multiprocessing as mp

            with mp.Pool(workers, _init_bpe, (codes,)) as pool:
                for seg in pool.imap(_apply_bpe_line, lines, chunksize=2000):
                    out.write(seg)
        else:
            _init_bpe(codes)
            for line in lines:
                out.write(_apply_bpe_line(line))
    progress.done()


def _spm():
    try:
        import sentencepiece
    except ImportError:
        raise InputError(
            "--bpe sentencepiece needs the sentencepiece package (pip install sentencepiece)"
        ) from None
    return sentencepiece


def spm_train(inputs: Sequence[str], model: str, size: int, sample: int = 10_000_000):
    """A joint sentencepiece BPE model of ``size`` pieces on ``inputs``, written to ``model``."""
    spm = _spm()
    for path in inputs:
        count_lines_utf8(path)
    folder = os.path.dirname(os.path.abspath(model))
    tmp_prefix = tempfile.mkdtemp(prefix=".spm.", dir=folder)
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(inputs),
            model_prefix=os.path.join(tmp_prefix, "m"),
            vocab_size=size,
            model_type="bpe",
            character_coverage=1.0,
            input_sentence_size=sample,
            shuffle_input_sentence=True,
        )
        os.replace(os.path.join(tmp_prefix, "m.model"), model)
    finally:
        shutil.rmtree(tmp_prefix, ignore_errors=True)


def spm_encode(model: str, input_path: str, output_path: str):
    """Every line segmented with a sentencepiece model."""
    spm = _spm()
    if not os.path.isfile(model) or os.path.getsize(model) == 0:
        raise InputError(f"{model}: missing or empty sentencepiece model file")
    proc = spm.SentencePieceProcessor(model_file=model)
    count_lines_utf8(input_path)
    with atomic_write(output_path) as out:
        for line in read_lines(input_path):
            out.write(" ".join(proc.encode(line, out_type=str)) + "\n")
