"""A watch client converges to what a fresh list says, whatever the fleet does between
reads: publishes, duplicates, removals, nodes going stale with the clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule, ReferenceMode
from sandboxctl.core.model import Entry
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import Query, SandboxStore
from tests.store.inventories import T0, node

NODES = ("a", "b", "c")
NAMES = ("default/x", "default/y", "team/x")
RULES = (FreshnessRule(), FreshnessRule(mode=ReferenceMode.EXTRAPOLATE))
QUERIES = (
    Query.parse(None),
    Query.parse("default"),
    Query.parse(None, labels="sandbox.cocoonstack.io/phase=Running"),
    Query.parse("default", fields="status.nodeName!=b"),
    Query.parse("default", fields="metadata.name=x"),
    # pinned, with a selector that may reject the first holder and accept a duplicate
    Query.parse("default", labels="sandbox.cocoonstack.io/phase=Running", fields="metadata.name=x"),
)

_entries = st.builds(
    Entry,
    name=st.sampled_from(NAMES),
    phase=st.sampled_from(("Running", "Hibernated")),
    id=st.sampled_from(("sb_1", "sb_2")),
)
_ops = st.one_of(
    # a publish: the node's entries (a name may repeat), stamped now or some time ago
    st.tuples(
        st.just("apply"),
        st.sampled_from(NODES),
        st.lists(_entries, max_size=4),
        st.sampled_from((0, 0, 45, 70, 100)),
    ),
    st.tuples(st.just("advance"), st.integers(min_value=1, max_value=120)),
    st.tuples(st.just("remove"), st.sampled_from(NODES)),
    st.tuples(st.just("same"), st.sampled_from(NODES)),  # the same inventory, a new record
    st.tuples(st.just("read")),  # a read between changes (the watch polls here)
)


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


@settings(database=None, deadline=None, max_examples=150)
@given(
    rule=st.sampled_from(RULES),
    query=st.sampled_from(QUERIES),
    start=st.lists(_entries, max_size=3),
    ops=st.lists(_ops, max_size=14),
)
def test_a_watch_client_always_agrees_with_a_fresh_list(
    rule: FreshnessRule, query: Query, start: list[Entry], ops: list[tuple[Any, ...]]
) -> None:
    clock = ManualClock(T0)
    source = MemoryInventorySource([node(n, *start) for n in NODES[:2]], clock=clock)
    store = SandboxStore(source, rule, clock=clock)
    watch = store.watch(query)
    client = {_key(event.object): event.object for event in watch.open()}
    version = watch.version

    for op in ops:
        if op[0] == "apply":
            _, name, entries, ago = op
            source.apply(node(name, *entries, stamp=clock.now() - timedelta(seconds=ago)))
        elif op[0] == "advance":
            clock.advance(op[1])
        elif op[0] == "remove":
            source.remove(op[1])
        elif op[0] == "same":
            record = source.snapshot().record(op[1])
            if record is not None:
                source.apply(record.inventory)
        if op[0] != "read":
            continue
        state = store.state()  # its names come from an earlier state's, never re-sorted
        assert state.names() == sorted(state.held)
        for event in watch.poll():
            key = _key(event.object)
            assert int(event.object["metadata"]["resourceVersion"]) > version
            version = int(event.object["metadata"]["resourceVersion"])
            if event.type == "ADDED":
                assert key not in client
                client[key] = event.object
            elif event.type == "MODIFIED":
                assert key in client
                client[key] = event.object
            else:
                assert event.type == "DELETED"
                assert client.pop(key)["metadata"]["name"] == event.object["metadata"]["name"]

    for event in watch.poll():  # catch up, then compare with a list and a new store
        key = _key(event.object)
        if event.type == "DELETED":
            client.pop(key)
        else:
            client[key] = event.object
    listed = {_key(obj): obj for obj in store.list(query).items}
    assert client == listed
    for obj in listed.values():  # a get finds the object a list shows, on the same node
        meta = obj["metadata"]
        got = store.get(meta["namespace"], meta["name"])
        # or, for a pinned list, the first holder, when the selectors reject it
        assert got is obj or (query.pin and got["status"]["nodeName"] < obj["status"]["nodeName"])
    fresh = SandboxStore(source, rule, clock=clock).list(query).items
    strip = {
        k: {**o, "metadata": {**o["metadata"], "resourceVersion": ""}} for k, o in listed.items()
    }
    assert strip == {
        _key(o): {**o, "metadata": {**o["metadata"], "resourceVersion": ""}} for o in fresh
    }
