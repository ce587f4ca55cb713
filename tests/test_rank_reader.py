"""One ordered reader per rank: text before a mark comes out before the mark's event, whichever pipe is read
first, and nothing is ever held waiting for the rank. Real pipes, written as a rank writes them."""

from __future__ import annotations

import os
import selectors
import types

import pytest

from kernelside.channel import EventReader, encode
from kernelside.engines.local_group import RankPipes
from kernelside.engines.rank_reader import RankReader
from kernelside.worker.output_positions import mark_bytes

TOKEN = b"0123456789abcdef" * 2


class _Mark:
    """``MARK % n``: mark n of the rank whose token the fixture announced."""

    def __mod__(self, n: int) -> bytes:
        return mark_bytes(TOKEN, n)


MARK = _Mark()


@pytest.fixture
def rank():
    pipes = RankPipes.create()
    sel = selectors.DefaultSelector()
    worker = types.SimpleNamespace(rank=0, pipes=pipes)
    reader = RankReader(worker, sel, EventReader())
    os.write(pipes.events_w, encode("marks", {"token": TOKEN.decode()}))  # as start_rank's marks_are_read() does
    yield pipes, reader
    sel.close()
    for fd in (*pipes.read_ends(), *pipes.write_ends()):
        try:
            os.close(fd)
        except OSError:
            pass


def _text(items):
    return [(i[1], i[2]) if i[0] == "output" else ("event", i[1]) for i in items]


def test_an_event_read_before_its_text_still_comes_after_it(rank):
    pipes, reader = rank
    os.write(pipes.stdout_w, b"from C before\n" + MARK % 1 + b"after\n")
    os.write(pipes.stderr_w, b"warning before\n" + MARK % 1)
    os.write(pipes.events_w, encode("display", {"op": "display", "mark": 1}))
    items = reader.on_readable("events")  # the event pipe first: it takes the text before its mark along
    items += reader.drain()
    assert _text(items) == [
        ("stdout", b"from C before\n"),
        ("stderr", b"warning before\n"),
        ("event", "display"),
        ("stdout", b"after\n"),
    ]


def test_text_after_a_mark_waits_for_its_event(rank):
    pipes, reader = rank
    os.write(pipes.stdout_w, b"before\n" + MARK % 1 + b"after\n")
    assert _text(reader.on_readable("stdout")) == [("stdout", b"before\n")]
    os.write(pipes.events_w, encode("input_request", {"id": 1, "mark": 1}))
    assert _text(reader.on_readable("events")) == [("event", "input_request"), ("stdout", b"after\n")]


def test_a_mark_split_across_reads_is_still_found(rank):
    pipes, reader = rank
    mark = MARK % 12
    os.write(pipes.stdout_w, b"one\n" + mark[:5])
    assert _text(reader.on_readable("stdout")) == [("stdout", b"one\n")]
    os.write(pipes.stdout_w, mark[5:] + b"two\n")
    assert _text(reader.on_readable("stdout")) == []  # waits for event 12
    os.write(pipes.events_w, encode("display", {"mark": 12}))
    assert _text(reader.on_readable("events")) == [("event", "display"), ("stdout", b"two\n")]


def test_nothing_waits_for_a_mark_that_never_reached_the_pipe_or_an_event_that_never_came(rank):
    pipes, reader = rank
    # fd 1 moved by user code: the event's mark is not in the pipe, so the event goes out at once
    os.write(pipes.events_w, encode("display", {"mark": 3}))
    assert _text(reader.on_readable("events")) == [("event", "display")]
    # a mark whose event could not be sent: a bare mark event releases the text, and is not shown
    os.write(pipes.stdout_w, MARK % 4 + b"after a failed display\n")
    assert _text(reader.on_readable("stdout")) == []
    os.write(pipes.events_w, encode("mark", {"mark": 4}))
    assert _text(reader.on_readable("events")) == [("stdout", b"after a failed display\n")]
    # the rank ended between a mark and its event: the end gives everything out, marks stripped
    os.write(pipes.stdout_w, b"x" + MARK % 5 + b"last words\n")
    assert _text(reader.drain(final=True)) == [("stdout", b"x"), ("stdout", b"last words\n")]


def test_text_that_looks_like_a_mark_without_the_token_is_text_and_holds_nothing_back(rank):
    pipes, reader = rank
    forged = [b"\x1b]nblaunch;1\x07", b"\x1b]nblaunch;" + b"9" * 5000 + b"\x07", mark_bytes(b"f" * 32, 2)]
    os.write(pipes.stdout_w, b"".join(forged) + b"tick 0\n")
    items = reader.on_readable("stdout")
    assert _text(items) == [("stdout", b"".join(forged) + b"tick 0\n")]


def test_a_mark_read_before_the_token_event_waits_for_nothing_and_is_not_shown(rank):
    pipes, reader = rank
    os.write(pipes.stdout_w, b"before\n" + MARK % 1 + b"after\n")
    os.write(pipes.events_w, encode("display", {"mark": 1}))
    items = reader.on_readable("stdout")  # stdout first: the reader reads the token (and the event) itself
    assert _text(items) == [("stdout", b"before\n"), ("event", "display"), ("stdout", b"after\n")]
