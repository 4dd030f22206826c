"""The sources' subscribers: one subscription, one token."""

from __future__ import annotations

from sandboxctl.inventory.source import Subscribers


def test_a_listener_subscribed_twice_is_called_twice_and_unsubscribed_once_per_token() -> None:
    subscribers = Subscribers()
    calls: list[int] = []

    def listener() -> None:
        calls.append(1)

    first = subscribers.subscribe(listener)
    second = subscribers.subscribe(listener)
    subscribers.notify()
    assert len(calls) == 2

    first()
    first()  # idempotent: never drops the other subscription
    subscribers.notify()
    assert len(calls) == 3

    second()
    subscribers.notify()
    assert len(calls) == 3


def test_a_failing_listener_does_not_stop_the_others() -> None:
    subscribers = Subscribers()
    calls: list[str] = []

    def fails() -> None:
        raise RuntimeError("a reader's bug")

    subscribers.subscribe(fails)
    subscribers.subscribe(lambda: calls.append("ran"))
    subscribers.notify()
    assert calls == ["ran"]
