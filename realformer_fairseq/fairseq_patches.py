"""Every change that importing the plugin makes to fairseq 0.12.3, in one place.

fairseq imports a ``--user-dir`` plugin inside each console command before it reads a
checkpoint, an input line or a batch, and offers no extension point for any of them, so these
four fairseq functions and one class are wrapped or replaced (each replacement is idempotent,
calls fairseq's own code and changes only what its module docstring says), and the fairseq
modules that ask for a numpy alias the running numpy no longer has (or a keyword it no longer
takes) get their own ``np`` with it (nothing where numpy has it; the one alias not supplied, and
why: :mod:`.numpy_compat`).
Nothing else in fairseq is changed:
``tests/test_package_structure.py::test_importing_the_plugin_changes_only_the_listed_fairseq_functions``
compares every attribute of every loaded fairseq module before and after the import.

=========================================  =============================================  ==========================
wrapped or replaced                        fairseq 0.12.3 bug it works around             module
=========================================  =============================================  ==========================
``fairseq.checkpoint_utils.                torch >= 2.6 loads with ``weights_only=True``;  :mod:`.checkpoint_compat`
load_checkpoint_to_cpu``                   fairseq's checkpoints hold a Namespace /
                                           DictConfig, so no checkpoint loads. Runs
                                           fairseq's loader with an allow-list of the
                                           types fairseq writes. A truncated or corrupt
                                           file (torch's zip-reader ``RuntimeError``)
                                           becomes ``RealformerCheckpointError``: one line
                                           under fairseq's commands.
``fairseq.checkpoint_utils.                a file torch reads that is no checkpoint (a     :mod:`.checkpoint_compat`
_upgrade_state_dict`` (called by           bare state dict) fails in its first upgrade
``load_checkpoint_to_cpu`` alone)          step: ``KeyError: 'best_loss'``. Checks for
                                           the model state and config first: one
                                           ``RealformerCheckpointError`` naming the file.
``fairseq_cli.interactive.make_batches``   one input line longer than the model's          :mod:`.interactive_compat`
(only when ``fairseq_cli.interactive``     source positions ends ``fairseq-interactive``
is loaded, i.e. under that command)        with a traceback and the rest of the input
                                           is lost. Skips that line with one warning.
``fairseq_cli.interactive.buffered_read``  ``--input FILE`` is read as strict UTF-8: one   :mod:`.interactive_compat`
(replaced, same condition)                 byte that is not UTF-8 ends the command with
                                           a ``UnicodeDecodeError`` before any line is
                                           translated. Reads the same buffers, with
                                           U+FFFD and one warning for such a byte.
``fairseq.data.iterators.                 a command that ends while fairseq's daemon     :mod:`.iterator_compat`
BackgroundConsumer`` (replaced by a        thread collates the next batches in a torch
subclass; ``run`` is fairseq's)            op (``fairseq-train`` at ``--max-update`` in
                                           mid-epoch) aborts as Python ends the thread:
                                           ``terminate called without an active
                                           exception``, exit 134 after the last
                                           checkpoint. At exit each consumer finishes
                                           its batch and stops first.
``np`` of ``fairseq.data.``                fairseq 0.12.3 asks numpy for what numpy has   :mod:`.numpy_compat`
``token_block_dataset`` and                removed: ``np.compat.long`` (numpy 2.0;
``language_pair_dataset`` (numpy >= 2),    reached by ``--sample-break-mode eos`` and
``data_utils`` (numpy >= 2.4), and         ``--num-batch-buckets``), ``np.percentile``'s
``fairseq.modules.dynamic_crf_layer``      ``interpolation=`` (numpy 2.4; also
(numpy >= 1.24): replaced only where       ``--num-batch-buckets``), ``np.float``
the running numpy lacks what the module    (numpy 1.24; ``DynamicCRF``): an
needs                                      ``AttributeError`` / ``TypeError``. That
                                           module's ``np`` becomes numpy's namespace
                                           plus what numpy 1.x gave (``int``, ``float``,
                                           ``interpolation=`` as ``method=``); numpy
                                           itself is not changed.
=========================================  =============================================  ==========================

Registering the plugin's models, architectures, criterion, optimizer and BPE (``wordpiece``) in fairseq's
registries is what ``--user-dir`` asks for, and is not a patch.
"""

from . import checkpoint_compat, interactive_compat, iterator_compat, numpy_compat

PATCHES = (checkpoint_compat, interactive_compat, iterator_compat, numpy_compat)


def install():
    """Install every patch (idempotent); the package's ``__init__`` calls it."""
    for patch in PATCHES:
        patch.install()
