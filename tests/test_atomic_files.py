"""realformer_fairseq.atomic_files, the one atomic-write helper of the plugin, its commands and
the studies (RealFormer, He et al. 2020, arXiv 2012.11747): a write either replaces the whole
file or leaves the old one, never a temporary file behind, with an ordinary file's mode."""

import json
import os
import stat

import pytest

from realformer_fairseq.atomic_files import atomic_output, write_json_atomic, write_text_atomic


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "omega.json"
    write_json_atomic(path, {"omega": 1.5})
    with pytest.raises(RuntimeError):
        with atomic_output(path) as tmp:
            with open(tmp, "w") as fh:
                fh.write('{"omega": ')
            raise RuntimeError("killed half-way")
    assert json.loads(path.read_text()) == {"omega": 1.5}
    assert os.listdir(tmp_path) == ["omega.json"]


def test_a_finished_write_replaces_the_file_with_an_ordinary_mode(tmp_path):
    path = tmp_path / "table.md"
    path.write_text("old\n")
    old_umask = os.umask(0o027)
    try:
        write_text_atomic(path, "| new |\n")
    finally:
        os.umask(old_umask)
    assert path.read_text() == "| new |\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # 0o666 & ~umask, not mkstemp's 0o600
    assert os.listdir(tmp_path) == ["table.md"]
