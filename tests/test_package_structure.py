"""The package's structure: the import graph points one way (models -> modules ->
settings/errors), and the plugin's flags are read in one function.

He et al. 2020 (RealFormer, arXiv 2012.11747) and Liu et al. 2020 (ADMIN, arXiv 2004.08249)
are implemented in modules/; how a model asks for them is settings.py's business alone, so
that a flag cannot be read (and defaulted) differently in two places.
"""

import argparse
import ast
import collections
import sys
from pathlib import Path

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from harness import toy_dictionary

import realformer_fairseq
from realformer_fairseq.settings import FLAG_KEYS

PACKAGE = Path(realformer_fairseq.__file__).resolve().parent


def plugin_imports(path: Path):
    """The ``realformer_fairseq.*`` modules that the file at ``path`` imports."""
    package = "realformer_fairseq." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + "."
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level)[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.startswith("realformer_fairseq"):
                imported.add(target)
                imported.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names if a.name.startswith("realformer_fairseq"))
    return imported


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_import_graph_points_from_models_to_modules_to_settings():
    files = sorted(PACKAGE.rglob("*.py"))
    assert PACKAGE / "settings.py" in files and len(files) > 15
    for path in files:
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for target in plugin_imports(path):
            layer = layer_of(target)
            if own in ("settings", "errors"):
                assert layer in ("errors", ""), f"{path.name} imports {target}"
            if own == "modules":
                assert layer not in (
                    "models",
                    "cli",
                    "criterions",
                    "optim",
                ), f"modules/{path.name} imports {target}"


def test_the_import_graph_check_can_fail(tmp_path):
    bad = PACKAGE / "modules" / "_probe_bad_import.py"
    bad.write_text("from ..models.architectures import FAMILIES\n", encoding="utf-8")
    try:
        with pytest.raises(AssertionError, match="modules/_probe_bad_import.py imports"):
            test_import_graph_points_from_models_to_modules_to_settings()
    finally:
        bad.unlink()


class RecordingNamespace(argparse.Namespace):
    """An argparse Namespace that records which plugin function reads each plugin flag, and
    how many times each flag is read by each."""

    def __getattribute__(self, name):
        if name in FLAG_KEYS:
            own = object.__getattribute__(self, "__dict__")
            readers = own.setdefault("_readers", set())
            reads = own.setdefault("_reads", collections.Counter())
            frame = sys._getframe(1)
            while frame is not None and not frame.f_code.co_filename.startswith(str(PACKAGE)):
                frame = frame.f_back
            if frame is not None:  # the innermost plugin function on the stack
                reader = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
                readers.add(reader)
                reads[name, reader] += 1
        return super().__getattribute__(name)


def build_family(arch: str, task):
    args = RecordingNamespace(arch=arch, _name=arch)
    ARCH_CONFIG_REGISTRY[arch](args)
    ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    return args.__dict__.get("_readers", set()), args


def settings_reads(args) -> dict:
    """flag -> how many times the settings reader's accessor read it."""
    reads = args.__dict__.get("_reads", {})
    return {key: reads.get((key, "settings.py:config_value"), 0) for key in sorted(FLAG_KEYS)}


def tasks():
    from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
    from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    dictionary = toy_dictionary()
    return {
        "realformer_tiny": TranslationTask(TranslationConfig(), dictionary, dictionary),
        "realformer_bert_tiny": MaskedLMTask(MaskedLMConfig(tokens_per_sample=32), dictionary),
        "realformer_lm_tiny": LanguageModelingTask(
            LanguageModelingConfig(tokens_per_sample=32), dictionary
        ),
    }


@pytest.mark.parametrize("arch", ["realformer_tiny", "realformer_bert_tiny", "realformer_lm_tiny"])
def test_every_family_reads_the_flags_in_one_function(arch):
    """Besides the architecture functions, which only fill in defaults, the one plugin
    function that reads a plugin flag from the model config is the settings reader."""
    torch.manual_seed(0)
    readers, args = build_family(arch, tasks()[arch])
    assert "settings.py:config_value" in readers  # read_realformer_settings' accessor
    defaults = {"architectures.py:set_defaults", "architectures.py:realformer_flag_defaults"}
    assert readers - defaults == {"settings.py:config_value"}, readers
    # each flag read once per build: not skipped (0, a flag the table lost) and not read again
    # by a second caller of the reader, which could default it otherwise (2)
    assert settings_reads(args) == {key: 1 for key in sorted(FLAG_KEYS)}
    # ... which a second reading of the settings during the build would break
    realformer_fairseq.settings.read_realformer_settings(args)
    assert set(settings_reads(args).values()) == {2}


PATCH_PROBE = """
import importlib, json, sys, types
import fairseq.checkpoint_utils, fairseq.models, fairseq.tasks
for name in ("train", "generate", "interactive", "validate", "eval_lm", "hydra_train",
             "preprocess", "score"):
    importlib.import_module("fairseq_cli." + name)

def attributes():
    return {
        (name, attr): value
        for name, module in list(sys.modules.items())
        if module is not None and name.split(".")[0] in ("fairseq", "fairseq_cli")
        for attr, value in list(vars(module).items())
    }

before = attributes()
import realformer_fairseq
after = attributes()
changed = [f"{m}.{a}" for (m, a), v in before.items() if (m, a) in after and after[m, a] is not v]
modules = {m for m, _ in before}
# a submodule imported later is added to its package: not a change (a replaced module is)
added = [f"{m}.{a}" for (m, a) in after if (m, a) not in before and m in modules
         and not isinstance(after[m, a], types.ModuleType)]
print(json.dumps({"changed": sorted(changed), "added": sorted(added)}))
"""


def test_importing_the_plugin_changes_only_the_listed_fairseq_functions():
    """Every attribute of every loaded fairseq / fairseq_cli module, before and after
    ``import realformer_fairseq``: only the wrapped functions of fairseq_patches.py differ
    (registries are filled in place: what ``--user-dir`` asks for)."""
    import json
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", PATCH_PROBE], capture_output=True, text=True, check=True
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    # and the numpy of the fairseq modules that ask for what this numpy removed (numpy 1.24:
    # np.float, 2.0: numpy.compat, 2.4: percentile's interpolation=): numpy_compat.py
    import numpy

    version = numpy.lib.NumpyVersion(numpy.__version__)
    numpy_stand_ins = ["fairseq.modules.dynamic_crf_layer.np"]
    numpy_stand_ins += (version >= "2.0.0") * [
        "fairseq.data.language_pair_dataset.np",
        "fairseq.data.token_block_dataset.np",
    ]
    numpy_stand_ins += (version >= "2.4.0") * ["fairseq.data.data_utils.np"]
    assert result == {
        "changed": sorted(
            [
                "fairseq.checkpoint_utils._upgrade_state_dict",
                "fairseq.checkpoint_utils.load_checkpoint_to_cpu",
                "fairseq.data.iterators.BackgroundConsumer",
                "fairseq_cli.interactive.buffered_read",
                "fairseq_cli.interactive.make_batches",
                *numpy_stand_ins,
            ]
        ),
        "added": [],
    }
    import realformer_fairseq.fairseq_patches as patches

    documented = patches.__doc__
    for name in result["changed"]:
        module, function = name.rsplit(".", 1)
        assert function in documented and module.split(".")[-1] in documented, name
