"""The once-per-process WARNING lines of the residual attention routes.

RealFormer (He et al. 2020, arXiv 2012.11747) threads a score stream through each chain; the
routes that run it (the concat route, the triton route, the chains' one kept stream) fall back
where they cannot serve a call, and say why once per process at WARNING, whatever the number of
layers and batches that meet the same reason. One set of what was said, for all of them.
"""

import logging

# (logger name, message, arguments) already said at WARNING in this process
_SAID = set()


def warn_once(log: logging.Logger, message: str, *args) -> None:
    """``log.warning(message % args)`` the first time this process meets it, with
    "(said once per process)" appended."""
    key = (log.name, message, args)
    if key not in _SAID:
        _SAID.add(key)
        log.warning(message + " (said once per process)", *args)
