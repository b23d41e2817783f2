"""fairseq 0.12 on numpy 2: what fairseq still asks of numpy that numpy has since removed,
supplied to the fairseq modules that ask for it and to no one else.

fairseq 0.12.3 names numpy aliases and a keyword that numpy has removed (numpy 1.24 removed the
builtin-type aliases ``np.int`` / ``np.float``; numpy 2.0 ``numpy.compat``; numpy 2.4 the
``interpolation=`` keyword of ``np.percentile``, renamed ``method=`` in numpy 1.22). Each line
fails (``AttributeError`` / ``TypeError``) the moment it runs:

=========================================  ===================  ==========================================
fairseq module (line)                      needs                reached by; fails on
=========================================  ===================  ==========================================
``fairseq.data.token_block_dataset``       ``np.compat.long``   ``--sample-break-mode eos``
(125)                                                           (``fairseq-train --task masked_lm`` /
                                                                ``language_modeling``, ``fairseq-eval-lm``);
                                                                numpy >= 2.0
``fairseq.data.data_utils`` (877,          ``np.percentile(...,  ``fairseq-train --task translation
``get_buckets``)                           interpolation=)``    --num-batch-buckets N`` (first line);
                                                                numpy >= 2.4
``fairseq.data.language_pair_dataset``     ``np.compat.long``   the same command (second line);
(292)                                                           numpy >= 2.0
``fairseq.modules.dynamic_crf_layer``      ``np.float``         ``DynamicCRF`` with targets (fairseq's
(108)                                                           ``nacrf_transformer``, which no command of
                                                                this project runs); numpy >= 1.24
``fairseq.data.data_utils`` (524, 1107)    ``np.int``           **not supplied**: ``compute_mask_indices``
                                                                / ``_v3`` with ``no_overlap=True``
                                                                (wav2vec-style span masking, which no
                                                                model or command of this project reaches)
                                                                call ``Generator.randint`` a few lines
                                                                on, which no numpy has: the branch fails
                                                                on every numpy and an alias would only
                                                                move the error (:data:`NOT_SUPPLIED`)
=========================================  ===================  ==========================================

What is supplied is what numpy 1.x gave: ``numpy.compat.long`` is ``int`` (numpy/compat/py3k.py),
``np.float`` was the builtin ``float`` re-exported (numpy < 1.24), and ``interpolation=`` is
passed on as ``method=`` (numpy 1.22's rename: the same methods, same results). So a line that
asks for them computes what it computed on the numpy fairseq 0.12 was written for.

How: each of these fairseq modules does ``import numpy as np``; where the running numpy lacks
something that the module needs, :func:`install` replaces that module's global ``np`` by a
:class:`NumpyWithSupplements`: a module object holding numpy's own namespace (the same functions,
types and submodules: ``np.random``'s state is numpy's) plus what is missing. Nothing else
changes: numpy itself is untouched (``numpy.float`` still raises, a user's own code and every other
module see the real numpy), no fairseq function or class is replaced, and a module whose numpy has
everything it needs keeps the real numpy (on numpy 1.26 only ``dynamic_crf_layer`` gets a
stand-in). Patching numpy instead (``numpy.compat = ...``) would change numpy for every package in
the process; re-owning the fairseq functions would copy dozens of lines to change one word each.

``tests/test_numpy_compat.py`` finds every ``np.*`` name and every keyword passed to a numpy
function in fairseq's own modules and checks that each resolves after the plugin's import (or is
in :data:`NOT_SUPPLIED`), and runs each supplied line: through the commands that reach it
(``fairseq-train --task masked_lm --sample-break-mode eos``, ``fairseq-train --task translation
--num-batch-buckets``; ``fairseq-eval-lm --sample-break-mode eos`` in ``test_lm_end_to_end``) and,
where no command of this project does, at function level.
"""

import importlib
import inspect
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy


def numpy_has(name: str, module=numpy) -> bool:
    """Whether ``module.<name>`` (dotted) resolves, without numpy's deprecation warnings
    (numpy 2.0-2.x's ``numpy.compat`` warns before it is gone)."""
    obj = module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for part in name.split("."):
            try:
                obj = getattr(obj, part)
            except (AttributeError, ImportError):
                return False
    return True


def percentile_takes_interpolation() -> bool:
    """numpy < 2.4: ``np.percentile`` still accepts ``interpolation=`` (since 1.22 a deprecated
    name of ``method=``)."""
    return "interpolation" in inspect.signature(numpy.percentile).parameters


def percentile(a, q, *args, interpolation=None, **kwargs):
    """``numpy.percentile`` that also takes numpy < 2.4's ``interpolation=``, passed on as
    ``method=`` (numpy 1.22 renamed it; fairseq 0.12's ``get_buckets`` passes
    ``interpolation="lower"``)."""
    if interpolation is not None:
        kwargs["method"] = interpolation
    return numpy.percentile(a, q, *args, **kwargs)


@dataclass(frozen=True)
class Supplement:
    """``np.<name>`` (dotted) for a fairseq module: ``value`` where the running numpy lacks it
    (``numpy_has_it()`` is false)."""

    name: str
    value: Any
    numpy_has_it: Callable[[], bool]


def alias(name: str, value) -> Supplement:
    return Supplement(name, value, lambda: numpy_has(name))


# fairseq module -> what it needs from numpy, and what numpy 1.x gave
SUPPLEMENTS = {
    "fairseq.data.token_block_dataset": (alias("compat.long", int),),
    "fairseq.data.data_utils": (
        Supplement("percentile", percentile, percentile_takes_interpolation),
    ),
    "fairseq.data.language_pair_dataset": (alias("compat.long", int),),
    "fairseq.modules.dynamic_crf_layer": (alias("float", float),),
}
# fairseq module -> {what it names: why it is not supplied}
NOT_SUPPLIED = {
    "fairseq.data.data_utils": {
        "int": "compute_mask_indices / compute_mask_indices_v3 with no_overlap=True call "
        "numpy.random.Generator.randint next, which no numpy has: the branch fails on every numpy"
    },
}


class NumpyWithSupplements(types.ModuleType):
    """``numpy`` (or one of its submodules, ``real``) with ``supplements`` ({dotted name:
    value}) added: its namespace is copied once (attribute look-ups stay plain dictionary hits,
    as on numpy itself) and a name numpy provides lazily (``np.testing``...) is still asked of
    numpy. ``real`` is ``None`` for a submodule the running numpy no longer has
    (``numpy.compat`` on numpy 2)."""

    def __init__(self, name: str, real, supplements: dict):
        super().__init__(name)
        if real is not None:
            self.__dict__.update(
                {k: v for k, v in vars(real).items() if k not in ("__getattr__", "__dir__")}
            )
        self.__dict__["_realformer_real"] = real
        self.__dict__["_realformer_supplements"] = dict(supplements)
        nested = {}
        for dotted, value in supplements.items():
            head, _, rest = dotted.partition(".")
            if rest:
                nested.setdefault(head, {})[rest] = value
            else:
                setattr(self, head, value)
        for head, inner in nested.items():
            inner_real = getattr(real, head) if numpy_has(head, real) else None
            setattr(self, head, NumpyWithSupplements(f"{name}.{head}", inner_real, inner))

    def __getattr__(self, name):
        real = self.__dict__["_realformer_real"]
        if real is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        return getattr(real, name)

    def __repr__(self):
        names = ", ".join(sorted(self.__dict__["_realformer_supplements"]))
        return f"<numpy {numpy.__version__} with what fairseq 0.12 needs of numpy 1.x: {names}>"


def missing(module_name: str) -> dict:
    """{name: value} of the supplements of ``module_name`` that the running numpy lacks."""
    return {s.name: s.value for s in SUPPLEMENTS[module_name] if not s.numpy_has_it()}


def install():
    """Give each fairseq module of :data:`SUPPLEMENTS` a numpy with what it needs that the
    running numpy lacks (idempotent; nothing where numpy has it all)."""
    for module_name in SUPPLEMENTS:
        module = importlib.import_module(module_name)
        supplements = missing(module_name)
        if not supplements or isinstance(module.np, NumpyWithSupplements):
            continue
        if module.np is not numpy:  # fairseq 0.12 does ``import numpy as np`` in each
            raise RuntimeError(f"{module_name}.np is not numpy: is fairseq 0.12 installed?")
        module.np = NumpyWithSupplements("numpy", numpy, supplements)
