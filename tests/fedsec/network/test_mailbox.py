"""The coordinator's mailboxes: an exchange is woken once, by the last answer it waits for, and a
site withdrawn mid-exchange (it reconnected) no longer holds the exchange up."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec.network.mailbox import Mailboxes

NAMES = tuple(f"site-{k}" for k in range(6))


class CountingCondition(threading.Condition):
    """A condition that counts how often a wait on it returned."""

    def __init__(self, lock: threading.RLock) -> None:
        super().__init__(lock)
        self.woken = 0

    def wait(self, timeout: float | None = None) -> bool:
        result = super().wait(timeout)
        self.woken += 1
        return result


def _mailboxes() -> tuple[Mailboxes, CountingCondition]:
    boxes = Mailboxes(NAMES)
    counting = CountingCondition(boxes._cond._lock)  # the one lock every condition shares
    boxes._cond = counting
    return boxes, counting


def _site(boxes: Mailboxes, name: str, *, answer: bool = True) -> threading.Thread:
    def work() -> None:
        job = boxes.poll(name, 30.0)
        assert job is not None
        if answer:
            assert boxes.answer(name, job[0], b"answer of " + name.encode())

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def _exchange(boxes: Mailboxes, names: tuple[str, ...], result: dict) -> threading.Thread:
    jobs = {name: (boxes.next_id(), name.encode()) for name in names}
    thread = threading.Thread(target=lambda: result.update(boxes.exchange(jobs, 60.0)))
    thread.start()
    return thread


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, len(NAMES)))
def test_an_exchange_is_woken_once_by_its_last_answer(n):
    boxes, counting = _mailboxes()
    names = NAMES[:n]
    result: dict = {}
    exchange = _exchange(boxes, names, result)
    sites = [_site(boxes, name) for name in names]
    for thread in [*sites, exchange]:
        thread.join(30)
    assert result == {name: b"answer of " + name.encode() for name in names}
    assert counting.woken == 1  # not once per answer


def test_a_site_withdrawn_mid_exchange_does_not_hold_it_until_the_deadline():
    boxes, counting = _mailboxes()
    result: dict = {}
    exchange = _exchange(boxes, NAMES[:3], result)
    quiet = _site(boxes, NAMES[0], answer=False)  # takes its job and never answers
    quiet.join(30)
    first = _site(boxes, NAMES[1])
    first.join(30)
    boxes.clear(NAMES[0])  # it reconnected: its job is withdrawn
    for _ in range(3000):  # the exchange saw the withdrawal and waits again, for the last answer only
        if counting.woken:
            break
        threading.Event().wait(0.01)
    assert counting.woken == 1 and exchange.is_alive()
    last = _site(boxes, NAMES[2])
    last.join(30)
    exchange.join(30)  # the deadline is 60 s: a join that times out leaves the thread alive
    assert not exchange.is_alive()
    assert result == {name: b"answer of " + name.encode() for name in NAMES[1:3]}
    assert counting.woken == 2
    assert not boxes.answer(NAMES[0], 1, b"late")  # nothing of the withdrawn job is pending
