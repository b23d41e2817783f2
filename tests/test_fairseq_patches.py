"""fairseq's data prefetch thread under the plugin (realformer_fairseq/iterator_compat.py).

fairseq 0.12.3's ``BufferedIterator`` collates batches in a daemon thread; a command that ends
while that thread is inside a torch op aborts (``terminate called without an active
exception``, exit 134): seen once in `.ci/run`'s SQuAD run, after ``fairseq-train`` had saved
its last checkpoint at ``--max-update`` in mid-epoch. The plugin's consumer is fairseq's with a
source that stops at exit; these tests check that a command ending mid-collation exits 0 under
the plugin (and aborts under fairseq alone), and that the batches are fairseq's.
"""

import subprocess
import sys
import time

import pytest
from fairseq.data import iterators

import realformer_fairseq  # noqa: F401  (installs the patches)
from realformer_fairseq import iterator_compat

FAIRSEQS_CONSUMER = iterator_compat.StoppableBackgroundConsumer.__mro__[1]

# a command that takes the first batch of 100, each collated in torch ops (the GIL released),
# and ends while the consumer thread collates the next ones
ENDS_WHILE_COLLATING = """
import sys, torch
from fairseq.data import iterators
if sys.argv[1] == "plugin":
    import realformer_fairseq

class Batches:
    def __len__(self):
        return 100
    def __iter__(self):
        x = [torch.randn(64, 64) for _ in range(64)]
        for i in range(100):
            for _ in range(20):
                torch.stack(x).sum()
            yield i

print("first batch", next(iterators.BufferedIterator(100, Batches())))
"""


def run_command(mode):
    return subprocess.run([sys.executable, "-c", ENDS_WHILE_COLLATING, mode],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_command_that_ends_while_batches_are_collated_exits_0_under_the_plugin():
    alone = run_command("fairseq")
    assert alone.returncode == -6, alone  # SIGABRT: the bug, under fairseq alone
    assert "terminate called without an active exception" in alone.stderr
    for _ in range(2):
        proc = run_command("plugin")
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "first batch 0\n", "")


@pytest.fixture
def fairseqs_consumer(monkeypatch):
    """``BufferedIterator`` as fairseq alone builds it."""

    def use():
        monkeypatch.setattr(iterators, "BackgroundConsumer", FAIRSEQS_CONSUMER)

    return use


class Failing:
    """3 batches, then the error fairseq's consumer hands to the trainer."""

    def __len__(self):
        return 10

    def __iter__(self):
        yield from (0, 1, 2)
        raise ValueError("batch 3")


def consume(make, fairseq_alone):
    out = []
    itr = make()
    try:
        for item in itr:
            out.append(item)
    except ValueError as err:
        out.append(f"ValueError: {err}")
    assert isinstance(itr._consumer, FAIRSEQS_CONSUMER)
    assert isinstance(itr._consumer, iterator_compat.StoppableBackgroundConsumer) != fairseq_alone
    return out


@pytest.mark.parametrize("fairseq_alone", [False, True], ids=["plugin", "fairseq"])
def test_the_consumer_hands_over_fairseqs_batches_in_fairseqs_order(
    fairseq_alone, fairseqs_consumer
):
    if fairseq_alone:
        fairseqs_consumer()
    assert consume(lambda: iterators.BufferedIterator(3, list(range(25))), fairseq_alone) == list(
        range(25)
    )
    take = lambda: iterators.BufferedIterator(2, list(range(25))).take(7)  # noqa: E731
    assert consume(take, fairseq_alone) == [0, 1, 2, 3, 4, 5, 6]
    failing = lambda: iterators.BufferedIterator(2, Failing())  # noqa: E731
    assert consume(failing, fairseq_alone) == [0, 1, 2, "ValueError: batch 3"]


def test_stopping_ends_a_consumer_blocked_on_a_full_buffer_after_the_batch_it_is_on():
    itr = iterators.BufferedIterator(2, list(range(1000)))
    assert next(itr) == 0
    deadline = time.monotonic() + 10
    while itr._queue.qsize() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # the consumer fills the buffer, then blocks on put
    assert itr._consumer.is_alive()
    start = time.monotonic()
    iterator_compat.stop_consumers()
    assert not itr._consumer.is_alive()
    assert time.monotonic() - start < 2
    # items 1 and 2 filled the buffer and were drained; the blocked put of item 3 returned,
    # then the consumer stopped: 4 of 1000 items taken from the source
    assert itr._consumer.count == 4
