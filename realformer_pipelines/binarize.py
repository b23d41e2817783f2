"""Several ``fairseq-preprocess`` commands in one Python process: fairseq's own
``fairseq_cli.preprocess.main`` on each command's arguments, as fairseq's tests run it, each
with its log in its own file. A GLUE task binarizes two inputs and its labels: three commands
that would each start a Python importing fairseq (3.3 CPU seconds), for a tenth of a second of
work. Importing this module imports nothing of fairseq; :func:`run_preprocess_commands` does.

A command file holds one command a line: ``LOG_FILE fairseq-preprocess ARGS...`` (shell
quoting). Each log starts with its command, so that one can be run again by hand.
"""

import logging
import shlex
from typing import List, Tuple

from .errors import InputError
from .startup import heavy_imports

# fairseq_cli/preprocess.py's logging.basicConfig format
FAIRSEQ_LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"
FAIRSEQ_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def read_commands(path: str) -> List[Tuple[str, List[str]]]:
    """(log file, fairseq-preprocess arguments) of each line of a command file."""
    commands = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            words = shlex.split(line)
            if not words:
                continue
            if len(words) < 2 or words[1] != "fairseq-preprocess":
                raise InputError(f"{path}:{number}: not 'LOG_FILE fairseq-preprocess ARGS...'")
            commands.append((words[0], words[2:]))
    if not commands:
        raise InputError(f"{path}: no fairseq-preprocess command")
    return commands


def run_preprocess_commands(commands: List[Tuple[str, List[str]]]) -> None:
    """Each (log file, arguments) through fairseq-preprocess's ``main``, in order; fairseq's
    log lines go to the command's log file only. A failing command raises InputError naming
    its log (its traceback is there)."""
    root = logging.getLogger()
    # fairseq_cli.preprocess calls logging.basicConfig(stream=sys.stdout) when imported: a
    # handler on the root logger first keeps its lines out of this process's stdout
    guard = logging.NullHandler()
    root.addHandler(guard)
    with heavy_imports():
        from fairseq import options
        from fairseq_cli import preprocess as fairseq_cli_preprocess

    level = root.level
    root.setLevel(logging.INFO)
    logger = logging.getLogger("fairseq_cli.preprocess")
    try:
        for log_file, args in commands:
            handler = logging.FileHandler(log_file, mode="w", encoding="utf-8")
            handler.setFormatter(logging.Formatter(FAIRSEQ_LOG_FORMAT, FAIRSEQ_DATE_FORMAT))
            root.addHandler(handler)
            own = logger.handlers[:]
            try:
                handler.stream.write(shlex.join(["fairseq-preprocess", *args]) + "\n")
                parser = options.get_preprocessing_parser()
                fairseq_cli_preprocess.main(parser.parse_args(args))
            except (Exception, SystemExit) as err:
                logging.getLogger(__name__).exception("fairseq-preprocess failed")
                raise InputError(
                    f"fairseq-preprocess failed ({type(err).__name__}), see {log_file}"
                ) from None
            finally:
                # main() adds a FileHandler (DESTDIR/preprocess.log) to its logger on every call
                for extra in logger.handlers:
                    if extra not in own:
                        extra.close()
                logger.handlers[:] = own
                root.removeHandler(handler)
                handler.close()
    finally:
        root.removeHandler(guard)
        root.setLevel(level)
