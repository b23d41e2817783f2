"""fairseq-interactive: an input line too long for the model is skipped with one warning, and a
byte that is not UTF-8 costs one warning instead of every translation.

fairseq 0.12's ``fairseq-interactive`` stops with a traceback (``Exception: Size of sample #0 is
invalid ...``) at the first input line whose source, after tokenization and BPE, is longer than
the model's maximum source positions, and the rest of the input is never translated. With
``--skip-invalid-size-inputs-valid-test`` it drops the line and logs a sample id counted within
the current ``--buffer-size`` block (always ``0`` with the default buffer of one line), which
names no input line.

Importing the plugin (which ``--user-dir`` does inside ``fairseq_cli.interactive.main``, before
the first line is read) wraps ``fairseq_cli.interactive.make_batches`` so that each such line is
skipped with one warning that names its input line and its ``S-/H-/D-`` id, its length and the
limit; every other line is translated as before, in order, under its own id (so the id of a
skipped line is missing from the output: join hypotheses to inputs on the id). Batches of lines
that fit are fairseq's own (tested). Nothing changes when ``fairseq_cli.interactive`` is not the
running command. In a Python process that imported the plugin *before* ``fairseq_cli.interactive``
(and then calls its ``cli_main``), call :func:`install` once more after that import.

fairseq 0.12's ``buffered_read`` opens ``--input FILE`` as strict UTF-8: one byte that is not
UTF-8 anywhere in the first block read (8 KiB) ends the command with a ``UnicodeDecodeError``
traceback before any line is translated (on stdin the locale decides). The plugin's
:func:`buffered_read` reads the same lines into the same buffers, and a line with such bytes is
translated with U+FFFD (the replacement character) in place of each one, after one warning
naming its input line, its id and the bytes; the output keeps one translation per input line.
"""

import fileinput
import functools
import logging
import sys

logger = logging.getLogger("realformer_fairseq.interactive")

_PATCHED_FLAG = "_realformer_skips_long_lines"


def source_limit(max_positions):
    """The source-length limit in fairseq's resolved ``max_positions`` (an int, a
    ``(source, target)`` tuple, or ``None`` for no limit)."""
    if isinstance(max_positions, (tuple, list)):
        return max_positions[0]
    return max_positions


def skip_long_lines(make_batches):
    """Wrap fairseq 0.12.3's ``fairseq_cli.interactive.make_batches(lines, cfg, task,
    max_positions, encode_fn)``: lines whose source (the part before the first tab when
    ``--constraints`` is on) encodes to more tokens (``</s>`` included, as fairseq counts) than
    the source limit are left out with a warning; the ids of the batches fairseq makes from the
    remaining lines are mapped back to positions in ``lines``."""
    lines_seen = [0]  # main() calls make_batches once per buffer, in input order

    @functools.wraps(make_batches)
    def wrapper(lines, cfg, task, max_positions, encode_fn):
        first_id = lines_seen[0]
        lines_seen[0] += len(lines)
        limit = source_limit(max_positions)
        if limit is None or not lines:
            return make_batches(lines, cfg, task, max_positions, encode_fn)
        constraints = bool(cfg.generation.constraints)
        sources = [line.split("\t")[0] if constraints else line for line in lines]
        _, lengths = task.get_interactive_tokens_and_lengths(sources, encode_fn)
        keep = []
        for i, length in enumerate(lengths):
            if length > limit:
                logger.warning(
                    "input line %d (id %d) is %d tokens long after tokenization and BPE, more "
                    "than the model's %d source positions: skipped, no translation for id %d",
                    first_id + i + 1,
                    first_id + i,
                    length,
                    limit,
                    first_id + i,
                )
            else:
                keep.append(i)
        if len(keep) == len(lines):
            return make_batches(lines, cfg, task, max_positions, encode_fn)
        return _remapped(
            make_batches([lines[i] for i in keep], cfg, task, max_positions, encode_fn), keep
        )

    setattr(wrapper, _PATCHED_FLAG, True)
    return wrapper


def _remapped(batches, keep):
    import torch

    index = torch.tensor(keep, dtype=torch.long)
    for batch in batches:
        yield batch._replace(ids=index[batch.ids.long()].to(batch.ids.dtype))


def replace_undecodable(line: str, line_no: int) -> str:
    """``line`` (decoded with ``surrogateescape``) with U+FFFD for each byte that was not UTF-8,
    after one warning naming the input line (from 1), its id and the bytes."""
    bad = [i for i, char in enumerate(line) if "\udc80" <= char <= "\udcff"]
    if not bad:
        return line
    shown = " ".join(f"0x{ord(line[i]) - 0xDC00:02x}" for i in bad[:5]) + (
        " ..." if bad[5:] else ""
    )
    logger.warning(
        "input line %d (id %d) is not valid UTF-8 (%d byte(s): %s at character %d): translated "
        "with U+FFFD in their place",
        line_no,
        line_no - 1,
        len(bad),
        shown,
        bad[0] + 1,
    )
    return "".join("\ufffd" if "\udc80" <= char <= "\udcff" else char for char in line)


def buffered_read(input, buffer_size):
    """fairseq 0.12.3's ``fairseq_cli.interactive.buffered_read`` (lists of up to
    ``buffer_size`` stripped lines of ``input``, a file or ``-`` for stdin), except that bytes
    that are not UTF-8 become U+FFFD with one warning per line (:func:`replace_undecodable`)
    where fairseq's raises ``UnicodeDecodeError`` (tested equal to fairseq's on UTF-8 input)."""
    if input == "-" and hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")
    buffer = []
    hook = fileinput.hook_encoded("utf-8", errors="surrogateescape")
    with fileinput.input(files=[input], openhook=hook) as h:
        for line_no, src_str in enumerate(h, 1):
            buffer.append(replace_undecodable(src_str.strip(), line_no))
            if len(buffer) >= buffer_size:
                yield buffer
                buffer = []

    if len(buffer) > 0:
        yield buffer


def install():
    """Wrap ``make_batches`` and replace ``buffered_read`` of a loaded ``fairseq_cli.interactive``
    (idempotent)."""
    module = sys.modules.get("fairseq_cli.interactive")
    if module is None or getattr(module.make_batches, _PATCHED_FLAG, False):
        return
    module.make_batches = skip_long_lines(module.make_batches)
    module.buffered_read = buffered_read
