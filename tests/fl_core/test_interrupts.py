"""A SIGINT during a round's commit is delivered after it, never inside it."""

from __future__ import annotations

import os
import signal

import pytest
from fedsec.fl_core.interrupts import deferred_interrupt


def test_sigint_inside_the_block_is_delivered_after_it() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("rest of the commit")
    assert done == ["rest of the commit"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_no_signal_no_interrupt_and_the_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGINT)
    with deferred_interrupt():
        pass
    assert signal.getsignal(signal.SIGINT) is before


def test_a_custom_handler_gets_the_held_signal() -> None:
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with deferred_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            assert seen == []
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
