"""realformer_pipelines.checks: the input checks every pipeline runs before fairseq does.

``read_mmap_index`` reads fairseq's mmap index without importing fairseq; here it is compared
with fairseq 0.12.3's own reader (``MMapIndexedDataset.Index``) on indexes that fairseq's
builder writes, for every dtype fairseq picks and for an empty dataset.
"""

import os

import numpy as np
import pytest
import torch

from realformer_pipelines.checks import check_binarized, read_mmap_index
from realformer_pipelines.errors import InputError


def write_dataset(prefix, dtype, lengths):
    """A fairseq mmap dataset written by fairseq's builder: sentences of the given lengths."""
    from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder

    builder = MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for i, n in enumerate(lengths):
        builder.add_item(torch.arange(i, i + n) % 200)
    builder.finalize(f"{prefix}.idx")
    return f"{prefix}.idx"


# every dtype of fairseq 0.12.3's _code_to_dtype that its builder can write
DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float64, np.uint16, np.uint32,
          np.uint64]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("lengths", [[3, 1, 7, 2], [5], []], ids=["four", "one", "empty"])
def test_read_mmap_index_equals_fairseqs_reader(dtype, lengths, tmp_path):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    idx = write_dataset(str(tmp_path / "train"), dtype, lengths)
    index = MMapIndexedDataset.Index(idx)
    n = len(index)
    need = int(index._pointers[-1]) + int(index._sizes[-1]) * index._dtype_size if n else 0
    assert read_mmap_index(idx) == (n, need) == (len(lengths), sum(lengths) * np.dtype(dtype).itemsize)
    assert need == os.path.getsize(str(tmp_path / "train.bin"))
    assert check_binarized(idx) == len(lengths)


def test_check_binarized_names_what_is_wrong(tmp_path):
    idx = write_dataset(str(tmp_path / "valid"), np.uint16, [4, 6])
    bin_path = tmp_path / "valid.bin"
    data = bin_path.read_bytes()
    assert len(data) == 20
    bin_path.write_bytes(data[:15])
    with pytest.raises(InputError, match=r"valid\.bin: truncated \(15 bytes, its index valid\.idx needs 20\)"):
        check_binarized(idx)
    bin_path.unlink()
    with pytest.raises(InputError, match=r"valid\.bin: missing \(its index .*valid\.idx exists\)"):
        check_binarized(idx)
    bin_path.write_bytes(data)
    whole = (tmp_path / "valid.idx").read_bytes()
    (tmp_path / "valid.idx").write_bytes(whole[:30])  # header, then cut inside the sizes
    with pytest.raises(InputError, match=r"valid\.idx: not a fairseq index file or truncated \(30 bytes for 2 sentences\)"):
        check_binarized(idx)
    (tmp_path / "valid.idx").write_bytes(b"TNTIDX\x00\x00" + whole[8:])  # the legacy format
    with pytest.raises(InputError, match=r"valid\.idx: not a fairseq index file \(dataset-impl mmap\)"):
        check_binarized(idx)
    (tmp_path / "valid.idx").unlink()
    with pytest.raises(InputError, match=r"valid\.idx: missing binarized index"):
        check_binarized(idx)


def imported_modules(*argv):
    """(stdout, the top-level modules a command imported), from ``python -X importtime``."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-X", "importtime", *map(str, argv)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    return proc.stdout, {name.split(".")[0] for name in names}


def test_stage_checks_start_no_fairseq_and_no_sacremoses(tmp_path):
    """What the pipelines run before every stage stays a fraction of a second: the data-bin
    check reads fairseq's index without fairseq (2.5 CPU seconds a process), the tokeniser's
    version comes from sacremoses' metadata (importing it: 0.3 s)."""
    from importlib import metadata

    from harness import REPO_ROOT

    root = tmp_path / "bin"
    root.mkdir()
    for lang in ("en", "fr"):
        (root / f"dict.{lang}.txt").write_text("a 1\n", encoding="utf-8")
        write_dataset(str(root / f"train.en-fr.{lang}"), np.uint16, [3, 4])
    script = REPO_ROOT / "examples" / "wmt14_en_fr" / "text_tools.py"
    _, modules = imported_modules(script, "check-data-bin", "--src", "en", "--tgt", "fr", root)
    assert not {"fairseq", "torch", "sacremoses"} & modules, sorted(modules)
    out, modules = imported_modules("-m", "realformer_pipelines.tools", "tokenizer-version")
    assert out == f"sacremoses-{metadata.version('sacremoses')}+perl-fixes-2\n"
    assert out == "sacremoses-0.2.0+perl-fixes-2\n"  # setup.py's pin
    assert not {"fairseq", "torch", "sacremoses"} & modules, sorted(modules)
