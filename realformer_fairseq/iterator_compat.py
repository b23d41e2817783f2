"""fairseq's data prefetch thread, stopped before the interpreter ends it (exit 134).

fairseq 0.12.3 collates training batches ahead of the trainer in a daemon thread
(``fairseq.data.iterators.BackgroundConsumer``, under ``BufferedIterator``: ``--data-buffer-size``,
default 10). When a command ends while that thread is inside a torch op (``fairseq-train``
stopping at ``--max-update`` in the middle of an epoch, the next batches still being collated),
Python's finalisation ends the thread as it takes the GIL back, unwinding through torch's C++
code: ``terminate called without an active exception``, SIGABRT, exit status 134, after the
last checkpoint was written. A pipeline reads that as a failed run.

The replacement is fairseq's class with its ``run`` unchanged: the source it iterates stops
when asked, and at exit (``atexit`` runs before the interpreter stops daemon threads) every live
consumer is asked to stop, its queue drained so that a blocked ``put`` returns, and joined (at
most :data:`STOP_WAIT_S` in all; past that, fairseq's behaviour). The batches a consumer hands
over are fairseq's, in fairseq's order (tests/test_fairseq_patches.py).
"""

import atexit
import queue
import threading
import time
import weakref

from fairseq.data import iterators

# seconds the exit hook waits for the consumers to finish the batch they are collating
STOP_WAIT_S = 10.0

_LIVE_CONSUMERS = weakref.WeakSet()


class StoppableBackgroundConsumer(iterators.BackgroundConsumer):
    """fairseq 0.12.3's ``BackgroundConsumer`` whose source stops after the item it is on when
    :meth:`request_stop` is called; ``run`` is fairseq's."""

    def __init__(self, queue, source, max_len, cuda_device):
        super().__init__(queue, source, max_len, cuda_device)
        self._stop_requested = threading.Event()
        self._source = self._until_stop_requested(source)
        _LIVE_CONSUMERS.add(self)

    def _until_stop_requested(self, source):
        # iterated in the consumer's thread, like fairseq's ``for item in self._source``
        for item in source:
            yield item
            if self._stop_requested.is_set():
                return

    def request_stop(self):
        self._stop_requested.set()


def _drain(items: queue.Queue):
    while True:
        try:
            items.get_nowait()
        except queue.Empty:
            return


def stop_consumers(wait_s: float = STOP_WAIT_S):
    """Stop every live consumer: the batch being collated is finished, nothing more is."""
    consumers = list(_LIVE_CONSUMERS)
    for consumer in consumers:
        consumer.request_stop()
    deadline = time.monotonic() + wait_s
    for consumer in consumers:
        while consumer.is_alive() and time.monotonic() < deadline:
            _drain(consumer._queue)  # a put blocked on a full queue returns
            consumer.join(0.01)


def install():
    """Replace ``fairseq.data.iterators.BackgroundConsumer`` (idempotent)."""
    if iterators.BackgroundConsumer is StoppableBackgroundConsumer:
        return
    iterators.BackgroundConsumer = StoppableBackgroundConsumer
    atexit.register(stop_consumers)
