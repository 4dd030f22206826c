"""The fleet snapshot and its views: indexes, structural sharing, freshness at read time."""

from __future__ import annotations

from datetime import datetime

from hypothesis import given
from hypothesis import strategies as st

from sandboxctl.core.freshness import FreshnessRule, NodeState, ReferenceMode, ReferenceOrigin
from sandboxctl.core.model import DEFAULT_NAMESPACE, PoolKey
from sandboxctl.core.snapshot import (
    MAX_STALLS,
    FleetSnapshot,
    Located,
    NodeRecord,
    Stall,
    WarmCandidate,
)
from tests.core.fleet_factory import T0, at, entry, inv, pool, quick, sec

RULE = FreshnessRule()
PY = PoolKey.of("python")


def fresh(snapshot: FleetSnapshot, now: datetime = T0) -> list[str]:
    return snapshot.view(RULE, now).fresh_nodes()


# --- building, replacing, removing ------------------------------------------------------------


def test_build_lists_nodes_in_name_order():
    snapshot = FleetSnapshot.build([inv("c"), inv("a"), inv("b")])
    assert snapshot.nodes == ("a", "b", "c")
    assert len(snapshot) == 3


def test_replace_inserts_a_new_node_in_name_order():
    snapshot = FleetSnapshot.build([inv("a"), inv("c")]).replace(inv("b"))
    assert snapshot.nodes == ("a", "b", "c")


def test_replace_of_a_known_node_swaps_its_inventory_and_keeps_the_node_list():
    new_b = inv("b", at(10), address="b:1")
    snapshot = FleetSnapshot.build([inv("a"), inv("b")]).replace(new_b)
    assert snapshot.nodes == ("a", "b")
    record = snapshot.record("b")
    assert record is not None
    assert record.inventory is new_b


def test_remove_drops_the_node_and_everything_it_held():
    a = inv("a", T0, address="a:1", pools=(pool("python", 2),), entries=(entry("t/x", "sb_1"),))
    snapshot = FleetSnapshot.build([a, inv("b", T0)]).remove("a")
    view = snapshot.view(RULE, T0)
    assert snapshot.nodes == ("b",)
    assert snapshot.record("a") is None
    assert view.lookup_name("t", "x") == []
    assert view.lookup_claim_id("sb_1") is None
    assert view.warm_candidates(PY) == []
    assert view.inventory("a") is None


def test_remove_of_an_unknown_node_returns_the_same_snapshot():
    snapshot = FleetSnapshot.build([inv("a")])
    assert snapshot.remove("zz") is snapshot


def test_replacing_one_node_leaves_the_other_nodes_records_identical():
    s1 = FleetSnapshot.build(
        [inv(n, T0, entries=(entry(f"t/{n}", f"sb_{n}"),)) for n in ("a", "b", "c")]
    )
    s2 = s1.replace(inv("b", at(5), entries=(entry("t/b2"),)))
    assert s2.record("a") is s1.record("a")
    assert s2.record("c") is s1.record("c")
    assert s2.record("b") is not s1.record("b")


def test_a_snapshot_is_unchanged_by_a_replace_made_from_it():
    old_b = inv("b", T0, address="b:1", pools=(pool("python", 2),), entries=(entry("t/x", "sb_1"),))
    s1 = FleetSnapshot.build([inv("a", T0), old_b])
    s2 = s1.replace(inv("b", at(30), address="b:2", entries=(entry("t/y", "sb_2"),)))
    s3 = s2.replace(inv("c", at(60)))

    v1 = s1.view(RULE, at(30))
    assert s1.nodes == ("a", "b")
    assert v1.inventory("b") is old_b
    assert v1.lookup_name("t", "x") == [Located("b", old_b.entries[0])]
    assert v1.lookup_name("t", "y") == []
    assert v1.lookup_claim_id("sb_1") == Located("b", old_b.entries[0])
    assert v1.warm_candidates(PY) == [WarmCandidate("b", "b:1", 2)]
    assert s1.newest == T0
    assert s2.nodes == ("a", "b")
    assert s3.nodes == ("a", "b", "c")


def test_a_snapshot_is_unchanged_by_a_remove_made_from_it():
    s1 = FleetSnapshot.build([inv("a", T0, entries=(entry("t/x"),)), inv("b", at(10))])
    s1.remove("a")
    s1.remove("b")
    assert s1.nodes == ("a", "b")
    assert s1.newest == at(10)
    assert [loc.node for loc in s1.view(RULE, at(10)).lookup_name("t", "x")] == ["a"]


# --- lookups --------------------------------------------------------------------------------


def test_lookup_name_returns_every_fresh_holder_in_node_order():
    on_b = entry("team/nb", "sb_b")
    on_a = entry("team/nb", "sb_a")
    snapshot = FleetSnapshot.build([inv("b", T0, entries=(on_b,)), inv("a", T0, entries=(on_a,))])
    assert snapshot.view(RULE, T0).lookup_name("team", "nb") == [
        Located("a", on_a),
        Located("b", on_b),
    ]


def test_lookup_name_excludes_a_stale_holder():
    on_a = entry("team/nb", "sb_a")
    on_b = entry("team/nb", "sb_b")
    snapshot = FleetSnapshot.build(
        [inv("a", at(-91), entries=(on_a,)), inv("b", T0, entries=(on_b,))]
    )
    assert snapshot.view(RULE, T0).lookup_name("team", "nb") == [Located("b", on_b)]


def test_lookup_name_keeps_a_holder_exactly_at_the_window():
    on_a = entry("team/nb")
    snapshot = FleetSnapshot.build([inv("a", at(-90), entries=(on_a,)), inv("b", T0)])
    assert snapshot.view(RULE, T0).lookup_name("team", "nb") == [Located("a", on_a)]


def test_lookup_name_without_namespace_is_found_in_default():
    scratch = entry("scratch")
    snapshot = FleetSnapshot.build([inv("a", entries=(scratch,))])
    view = snapshot.view(RULE, T0)
    assert view.lookup_name(DEFAULT_NAMESPACE, "scratch") == [Located("a", scratch)]
    assert view.lookup_name("team", "scratch") == []


def test_lookup_name_of_a_name_claimed_twice_on_one_node_answers_the_first():
    first = entry("t/x", "sb_1")
    second = entry("t/x", "sb_2")
    snapshot = FleetSnapshot.build([inv("a", entries=(first, second))])
    assert snapshot.view(RULE, T0).lookup_name("t", "x") == [Located("a", first)]


def test_lookup_claim_id_finds_the_holder():
    target = entry("t/x", "sb_7")
    snapshot = FleetSnapshot.build(
        [inv("a", T0, entries=(entry("t/y", "sb_1"),)), inv("b", T0, entries=(target,))]
    )
    view = snapshot.view(RULE, T0)
    assert view.lookup_claim_id("sb_7") == Located("b", target)
    assert view.lookup_claim_id("sb_missing") is None


def test_lookup_claim_id_skips_a_stale_holder():
    on_a = entry("t/x", "sb_7")
    on_b = entry("t/x", "sb_7")
    snapshot = FleetSnapshot.build(
        [inv("a", at(-200), entries=(on_a,)), inv("b", T0, entries=(on_b,))]
    )
    assert snapshot.view(RULE, T0).lookup_claim_id("sb_7") == Located("b", on_b)
    only_a = snapshot.remove("b")
    assert only_a.view(RULE, T0).lookup_claim_id("sb_7") == Located("a", on_a)


def test_entry_without_an_id_is_not_found_by_the_empty_id():
    snapshot = FleetSnapshot.build([inv("a", entries=(entry("t/x"),))])
    assert snapshot.view(RULE, T0).lookup_claim_id("") is None


def test_entry_removed_on_republish_leaves_the_name_and_id_indexes():
    kept = entry("t/kept", "sb_1")
    snapshot = FleetSnapshot.build([inv("a", T0, entries=(kept, entry("t/gone", "sb_2")))])
    snapshot = snapshot.replace(inv("a", at(30), entries=(kept,)))
    view = snapshot.view(RULE, at(30))
    assert view.lookup_name("t", "gone") == []
    assert view.lookup_claim_id("sb_2") is None
    assert view.lookup_name("t", "kept") == [Located("a", kept)]
    assert view.lookup_claim_id("sb_1") == Located("a", kept)


def test_a_name_that_moves_from_a_to_b_is_found_only_on_b():
    moving = entry("t/x", "sb_1")
    snapshot = FleetSnapshot.build([inv("a", T0, entries=(moving,)), inv("b", T0)])
    snapshot = snapshot.replace(inv("a", at(30)))
    snapshot = snapshot.replace(inv("b", at(31), entries=(moving,)))
    view = snapshot.view(RULE, at(31))
    assert view.lookup_name("t", "x") == [Located("b", moving)]
    assert view.lookup_claim_id("sb_1") == Located("b", moving)


def test_an_entry_whose_phase_changes_is_answered_with_the_new_entry():
    running = entry("t/x", "sb_1", phase="Running")
    hibernated = entry("t/x", "sb_1", phase="Hibernated")
    snapshot = FleetSnapshot.build([inv("a", T0, entries=(running,))])
    snapshot = snapshot.replace(inv("a", at(30), entries=(hibernated,)))
    view = snapshot.view(RULE, at(30))
    assert view.lookup_name("t", "x") == [Located("a", hibernated)]
    assert view.lookup_claim_id("sb_1") == Located("a", hibernated)


# --- warm candidates ------------------------------------------------------------------------


def test_warm_candidates_list_only_warm_pools_on_nodes_with_an_address():
    snapshot = FleetSnapshot.build(
        [
            inv("a", T0, address="a:7777", pools=(pool("python", 2),)),
            inv("b", T0, address="b:7777", pools=(pool("python", 0),)),
            inv("c", T0, pools=(pool("python", 3),)),
            inv("d", T0, address="d:7777", pools=(pool("node", 1),)),
            inv("e", T0, address="e:7777", pools=(pool("python", 1, size="large"),)),
        ]
    )
    view = snapshot.view(RULE, T0)
    assert view.warm_candidates(PY) == [WarmCandidate("a", "a:7777", 2)]
    assert view.warm_candidates(PoolKey.of("node")) == [WarmCandidate("d", "d:7777", 1)]
    assert view.warm_candidates(PoolKey.of("python", size="large")) == [
        WarmCandidate("e", "e:7777", 1)
    ]
    assert view.warm_candidates(PoolKey.of("ruby")) == []


def test_warm_candidates_are_in_node_order():
    snapshot = FleetSnapshot.build(
        [inv(n, T0, address=f"{n}:1", pools=(pool("python", 1),)) for n in ("c", "a", "b")]
    )
    assert [c.node for c in snapshot.view(RULE, T0).warm_candidates(PY)] == ["a", "b", "c"]


def test_warm_candidates_exclude_stale_nodes():
    snapshot = FleetSnapshot.build(
        [
            inv("a", at(-91), address="a:1", pools=(pool("python", 2),)),
            inv("b", T0, address="b:1", pools=(pool("python", 1),)),
        ]
    )
    assert snapshot.view(RULE, T0).warm_candidates(PY) == [WarmCandidate("b", "b:1", 1)]


def test_warm_candidates_follow_a_warm_count_change():
    snapshot = FleetSnapshot.build([inv("a", T0, address="a:1", pools=(pool("python", 2),))])
    snapshot = snapshot.replace(inv("a", at(30), address="a:1", pools=(pool("python", 5),)))
    assert snapshot.view(RULE, at(30)).warm_candidates(PY) == [WarmCandidate("a", "a:1", 5)]
    snapshot = snapshot.replace(inv("a", at(60), address="a:1", pools=(pool("python", 0),)))
    assert snapshot.view(RULE, at(60)).warm_candidates(PY) == []


def test_warm_candidates_drop_a_removed_pool():
    pools = (pool("python", 2), pool("node", 1))
    snapshot = FleetSnapshot.build([inv("a", T0, address="a:1", pools=pools)])
    snapshot = snapshot.replace(inv("a", at(30), address="a:1", pools=(pool("node", 1),)))
    view = snapshot.view(RULE, at(30))
    assert view.warm_candidates(PY) == []
    assert view.warm_candidates(PoolKey.of("node")) == [WarmCandidate("a", "a:1", 1)]


def test_warm_candidates_follow_an_address_change():
    pools = (pool("python", 2),)
    snapshot = FleetSnapshot.build([inv("a", T0, address="a:1", pools=pools)])
    snapshot = snapshot.replace(inv("a", at(30), address="a:2", pools=pools))
    assert snapshot.view(RULE, at(30)).warm_candidates(PY) == [WarmCandidate("a", "a:2", 2)]
    snapshot = snapshot.replace(inv("a", at(60), address="", pools=pools))
    assert snapshot.view(RULE, at(60)).warm_candidates(PY) == []
    snapshot = snapshot.replace(inv("a", at(90), address="a:3", pools=pools))
    assert snapshot.view(RULE, at(90)).warm_candidates(PY) == [WarmCandidate("a", "a:3", 2)]


# --- entries --------------------------------------------------------------------------------


def test_entries_filter_by_namespace_and_skip_stale_nodes():
    a_team = entry("team/a1")
    a_default = entry("a2")
    b_team = entry("team/b1")
    c_team = entry("team/c1")
    snapshot = FleetSnapshot.build(
        [
            inv("c", at(-91), entries=(c_team,)),
            inv("b", T0, entries=(b_team,)),
            inv("a", T0, entries=(a_team, a_default)),
        ]
    )
    view = snapshot.view(RULE, T0)
    assert list(view.entries("team")) == [Located("a", a_team), Located("b", b_team)]
    assert list(view.entries(DEFAULT_NAMESPACE)) == [Located("a", a_default)]
    assert list(view.entries()) == [
        Located("a", a_team),
        Located("a", a_default),
        Located("b", b_team),
    ]
    assert list(view.entries("nobody")) == []


# --- newest ---------------------------------------------------------------------------------


def test_newest_is_the_largest_stamp_and_unstamped_nodes_do_not_count():
    snapshot = FleetSnapshot.build([inv("a", at(10)), inv("b", at(30)), inv("c"), inv("d", at(20))])
    assert snapshot.newest == at(30)


def test_newest_of_an_unstamped_fleet_is_none():
    assert FleetSnapshot.build([inv("a"), inv("b")]).newest is None
    assert FleetSnapshot.empty().newest is None


def test_newest_goes_back_when_the_newest_node_regresses():
    snapshot = FleetSnapshot.build([inv("a", at(10)), inv("b", at(30))])
    assert snapshot.replace(inv("b", at(20))).newest == at(20)
    assert snapshot.replace(inv("b", at(5))).newest == at(10)
    assert snapshot.replace(inv("b")).newest == at(10)


def test_newest_goes_back_when_the_newest_node_is_removed():
    snapshot = FleetSnapshot.build([inv("a", at(10)), inv("b", at(30))])
    assert snapshot.remove("b").newest == at(10)
    assert snapshot.remove("b").remove("a").newest is None


def test_newest_stays_when_one_of_two_nodes_sharing_it_leaves():
    snapshot = FleetSnapshot.build([inv("a", at(30)), inv("b", at(30)), inv("c", at(10))])
    assert snapshot.remove("b").newest == at(30)


def test_newest_seen_at_is_the_seen_at_of_the_update_that_raised_newest():
    snapshot = FleetSnapshot.empty().replace(inv("a", at(0)), seen_at=100.0)
    assert (snapshot.newest, snapshot.newest_seen_at) == (at(0), 100.0)
    snapshot = snapshot.replace(inv("b", at(10)), seen_at=110.0)
    assert (snapshot.newest, snapshot.newest_seen_at) == (at(10), 110.0)
    # An update that does not raise newest leaves when it was first seen alone.
    snapshot = snapshot.replace(inv("a", at(5)), seen_at=115.0)
    snapshot = snapshot.replace(inv("b", at(10)), seen_at=120.0)
    assert (snapshot.newest, snapshot.newest_seen_at) == (at(10), 110.0)


def test_view_passes_newest_seen_at_to_an_extrapolating_rule():
    rule = FreshnessRule(stale_after=sec(91), mode=ReferenceMode.EXTRAPOLATE)
    snapshot = FleetSnapshot.build([inv("a", T0), inv("b", at(-80))], seen_at=100.0)
    early = snapshot.view(rule, at(60), monotonic=105.0)
    late = snapshot.view(rule, at(60), monotonic=115.0)
    assert early.reference.at == at(5)
    assert early.reference.origin is ReferenceOrigin.EXTRAPOLATED
    assert early.fresh_nodes() == ["a", "b"]
    assert late.reference.at == at(15)
    assert late.fresh_nodes() == ["a"]


# --- stall credit -----------------------------------------------------------------------------


def stalled_fleet():
    """a and b stamp at 0 and 10 s (seen then); nothing new until c stamps 600 s, seen at 600."""
    snapshot = FleetSnapshot.empty(stall_after=sec(30))
    snapshot = snapshot.replace(inv("a", at(0)), seen_at=0.0)
    snapshot = snapshot.replace(inv("b", at(10)), seen_at=10.0)
    return snapshot.replace(inv("c", at(600)), seen_at=600.0)


def test_a_silence_longer_than_one_interval_is_recorded_as_a_stall():
    # 590 s passed without a new stamp; all but one interval of it is credited.
    assert stalled_fleet().stalls == (Stall(before=at(10), excess=sec(560)),)


def test_no_stall_is_recorded_for_a_silence_of_one_interval():
    snapshot = FleetSnapshot.empty(stall_after=sec(30))
    snapshot = snapshot.replace(inv("a", at(0)), seen_at=0.0)
    snapshot = snapshot.replace(inv("a", at(30)), seen_at=30.0)
    assert snapshot.stalls == ()


def test_a_stall_counts_no_more_than_the_stamps_advanced():
    # The reader heard nothing for 590 s, but the new stamp is only 40 s past the old newest.
    snapshot = FleetSnapshot.empty(stall_after=sec(30))
    snapshot = snapshot.replace(inv("b", at(10)), seen_at=10.0)
    snapshot = snapshot.replace(inv("a", at(50)), seen_at=600.0)
    assert snapshot.stalls == (Stall(before=at(10), excess=sec(10)),)


def test_without_stall_after_no_stall_is_ever_recorded():
    snapshot = FleetSnapshot.empty().replace(inv("a", at(0)), seen_at=0.0)
    snapshot = snapshot.replace(inv("b", at(600)), seen_at=600.0)
    assert snapshot.stalls == ()
    assert snapshot.view(RULE, at(600)).fresh_nodes() == ["b"]


def test_stall_credit_keeps_nodes_stamped_before_the_stall():
    view = stalled_fleet().view(RULE, at(600))
    assert view.fresh_nodes() == ["a", "b", "c"]
    assert view.age("a") == sec(40)  # 600 - 0 - 560
    assert view.age("b") == sec(30)
    assert view.age("c") == sec(0)
    assert view.state("a") is NodeState.FRESH


def publish_every_30s(snapshot, node, start, end):
    """``node`` keeps publishing on time (no new stall) from ``start`` to ``end`` seconds."""
    for second in [*range(start, end, 30), end]:
        snapshot = snapshot.replace(inv(node, at(second)), seen_at=float(second))
    return snapshot


def test_stall_credit_only_delays_a_node_that_does_not_publish_again():
    # a never publishes again: 600 - 0 - 560 = 40 s behind at the stall; it goes once the
    # live stamps are 91 s past that, i.e. after 650 s.
    snapshot = publish_every_30s(stalled_fleet(), "c", 630, 650)
    assert snapshot.stalls == (Stall(before=at(10), excess=sec(560)),)
    assert "a" in snapshot.view(RULE, at(650)).fresh_nodes()
    snapshot = snapshot.replace(inv("c", at(651)), seen_at=651.0)
    view = snapshot.view(RULE, at(651))
    assert "a" not in view.fresh_nodes()
    assert view.state("a") is NodeState.STALE
    assert view.age("a") == sec(91)


def test_a_stamp_after_the_stall_earns_no_credit():
    snapshot = stalled_fleet().replace(inv("b", at(605)), seen_at=605.0)
    snapshot = publish_every_30s(snapshot, "c", 630, 696)
    view = snapshot.view(RULE, at(696))
    assert view.credit(at(605)) == sec(0)
    assert view.credit(at(10)) == sec(560)
    assert view.age("b") == sec(91)
    assert "b" not in view.fresh_nodes()


def test_only_the_latest_stalls_are_kept():
    snapshot = FleetSnapshot.empty(stall_after=sec(30))
    for i in range(MAX_STALLS + 4):
        snapshot = snapshot.replace(inv("a", at(100 * i)), seen_at=100.0 * i)
    assert len(snapshot.stalls) == MAX_STALLS
    assert snapshot.stalls[-1] == Stall(before=at(100 * (MAX_STALLS + 2)), excess=sec(70))
    assert snapshot.stalls[0].before == at(100 * 3)


def test_build_keeps_stall_after_and_starts_without_stalls():
    snapshot = FleetSnapshot.build([inv("a", at(0)), inv("b", at(600))], 5.0, sec(30))
    assert snapshot.stall_after == sec(30)
    assert snapshot.stalls == ()
    assert (snapshot.newest, snapshot.newest_seen_at) == (at(600), 5.0)


# --- views ----------------------------------------------------------------------------------


def test_view_states_cover_fresh_stale_unstamped_and_ahead():
    snapshot = FleetSnapshot.build(
        [inv("fresh", at(-30)), inv("stale", at(-91)), inv("old"), inv("rogue", at(3600))]
    )
    view = snapshot.view(RULE, T0)
    assert view.reference.at == T0
    assert {n: view.state(n) for n in snapshot.nodes} == {
        "fresh": NodeState.FRESH,
        "stale": NodeState.STALE,
        "old": NodeState.UNSTAMPED,
        "rogue": NodeState.AHEAD,
    }
    assert view.fresh_nodes() == ["fresh", "old", "rogue"]


def test_the_same_snapshot_answers_differently_as_the_reader_clock_moves():
    snapshot = FleetSnapshot.build([inv("a", T0), inv("b", at(100))])
    assert snapshot.view(RULE, at(50)).fresh_nodes() == ["a", "b"]
    assert snapshot.view(RULE, at(100)).fresh_nodes() == ["b"]


def test_view_inventory_is_none_for_stale_and_unknown_nodes():
    a = inv("a", T0)
    snapshot = FleetSnapshot.build([a, inv("b", at(-91))])
    view = snapshot.view(RULE, T0)
    assert view.inventory("a") is a
    assert view.inventory("b") is None
    assert view.inventory("zz") is None
    assert not view.is_fresh("zz")


def test_view_of_an_empty_snapshot_has_no_reference_and_no_nodes():
    view = FleetSnapshot.empty().view(RULE, T0)
    assert view.reference.at is None
    assert view.reference.origin is ReferenceOrigin.NONE
    assert view.fresh_nodes() == []


# --- properties: the indexes agree with a brute-force reading of the inventories -------------

NODES = ["a", "b", "c", "d"]
NAMES = ["x", "t/x", "t/y", "u/x", "default/x"]
IDS = ["", "sb_1", "sb_2"]
KEYS = [PoolKey.of("python"), PoolKey.of("python", size="large"), PoolKey.of("node")]

stamps = st.one_of(st.none(), st.integers(min_value=-300, max_value=300).map(at))
entries_st = st.lists(
    st.builds(entry, st.sampled_from(NAMES), st.sampled_from(IDS)), max_size=4
).map(tuple)
pools_st = st.lists(
    st.builds(
        lambda key, warm: pool(key.template, warm, net=key.net, size=key.size),
        st.sampled_from(KEYS),
        st.integers(min_value=0, max_value=3),
    ),
    max_size=3,
).map(tuple)
puts = st.builds(
    lambda node, stamp, address, pools, entries: (
        "put",
        inv(node, stamp, address=address, pools=pools, entries=entries),
    ),
    st.sampled_from(NODES),
    stamps,
    st.sampled_from(["", "h1:7777", "h2:7777"]),
    pools_st,
    entries_st,
)
removes = st.sampled_from(NODES).map(lambda node: ("remove", node))


@quick
@given(
    ops=st.lists(st.one_of(puts, puts, removes), max_size=12),
    now=st.integers(min_value=-300, max_value=300).map(at),
)
def test_snapshot_indexes_agree_with_the_inventories_after_any_updates(ops, now):
    snapshot = FleetSnapshot.empty()
    model = {}
    for op, arg in ops:
        if op == "put":
            snapshot = snapshot.replace(arg)
            model[arg.node] = arg
        else:
            snapshot = snapshot.remove(arg)
            model.pop(arg, None)

    stamped = [i.published_at for i in model.values() if i.published_at is not None]
    newest = max(stamped) if stamped else None
    assert snapshot.nodes == tuple(sorted(model))
    assert snapshot.newest == newest

    reference = RULE.reference(newest, now)
    fresh = [n for n in sorted(model) if not RULE.is_stale(model[n].published_at, reference)]
    view = snapshot.view(RULE, now)
    assert view.fresh_nodes() == fresh

    for name in NAMES:
        key = entry(name).namespaced_name
        expected = []
        for n in fresh:
            held = [e for e in model[n].entries if e.namespaced_name == key]
            if held:
                expected.append(Located(n, held[0]))
        assert view.lookup_name(*key) == expected

    for claim_id in IDS[1:]:
        holders = [Located(n, e) for n in fresh for e in model[n].entries if e.id == claim_id]
        assert view.lookup_claim_id(claim_id) == (holders[0] if holders else None)

    for key in KEYS:
        expected_warm = []
        for n in fresh:
            warm = sum(p.warm for p in model[n].pools if p.key == key)
            if model[n].address and warm > 0:
                expected_warm.append(WarmCandidate(n, model[n].address, warm))
        assert view.warm_candidates(key) == expected_warm

    assert list(view.entries()) == [Located(n, e) for n in fresh for e in model[n].entries]


@quick
@given(
    stamps=st.lists(stamps, min_size=1, max_size=6),
    now=st.integers(min_value=-300, max_value=300).map(at),
    stale_after=st.integers(min_value=1, max_value=200).map(sec),
)
def test_fresh_nodes_are_the_unstamped_and_the_not_stale_under_the_reference(
    stamps, now, stale_after
):
    rule = FreshnessRule(stale_after=stale_after)
    nodes = {f"n{i}": stamp for i, stamp in enumerate(stamps)}
    snapshot = FleetSnapshot.build(inv(n, s) for n, s in nodes.items())
    stamped = [s for s in stamps if s is not None]
    reference = rule.reference(max(stamped) if stamped else None, now)
    expected = [
        n for n in sorted(nodes) if nodes[n] is None or not rule.is_stale(nodes[n], reference)
    ]
    assert snapshot.view(rule, now).fresh_nodes() == expected


@quick
@given(inventories=st.lists(puts.map(lambda op: op[1]), max_size=8), seen_at=st.floats(0, 1e6))
def test_build_reads_the_same_as_replacing_each_inventory_in_turn(inventories, seen_at):
    built = FleetSnapshot.build(inventories, seen_at)
    folded = FleetSnapshot.empty()
    for inventory in inventories:
        folded = folded.replace(inventory, seen_at)
    assert built.nodes == folded.nodes
    assert built.newest == folded.newest
    if built.newest is not None:  # without a newest stamp, when it was seen means nothing
        assert built.newest_seen_at == folded.newest_seen_at
    for node in built.nodes:
        assert built.record(node).inventory is folded.record(node).inventory
    now = at(0)
    b, f = built.view(RULE, now), folded.view(RULE, now)
    assert b.fresh_nodes() == f.fresh_nodes()
    for name in NAMES:
        key = entry(name).namespaced_name
        assert b.lookup_name(*key) == f.lookup_name(*key)
    for claim_id in IDS:
        assert b.lookup_claim_id(claim_id) == f.lookup_claim_id(claim_id)
    for key in KEYS:
        assert b.warm_candidates(key) == f.warm_candidates(key)


# A source that reuses unchanged entries hands the same objects from one publish to the
# next: a replace then patches the node's record instead of building it. Entries drawn from
# one fixed set of objects (names and ids held twice included) take that path.
SHARED = [entry(name, claim_id) for name in NAMES for claim_id in IDS] + [entry("t/x", "sb_1")]
shared_puts = st.builds(
    lambda node, stamp, entries: inv(node, stamp, entries=tuple(entries)),
    st.sampled_from(NODES),
    stamps,
    st.lists(st.sampled_from(SHARED), max_size=6),
)


@quick
@given(ops=st.lists(st.one_of(shared_puts, shared_puts, removes), max_size=16))
def test_replacing_with_shared_entries_reads_the_same_as_a_fresh_build(ops):
    snapshot = FleetSnapshot.empty()
    model = {}
    for op in ops:
        if isinstance(op, tuple):
            snapshot = snapshot.remove(op[1])
            model.pop(op[1], None)
        else:
            snapshot = snapshot.replace(op)
            model[op.node] = op
    built = FleetSnapshot.build(model.values())
    for node in built.nodes:
        patched, fresh_record = snapshot.record(node), NodeRecord(model[node])
        assert patched.by_name == fresh_record.by_name
        assert patched.by_id == fresh_record.by_id
        assert patched.unique == fresh_record.unique
    now = at(0)
    b, f = built.view(RULE, now), snapshot.view(RULE, now)
    for name in NAMES:
        key = entry(name).namespaced_name
        assert b.lookup_name(*key) == f.lookup_name(*key)
    for claim_id in IDS:
        assert b.lookup_claim_id(claim_id) == f.lookup_claim_id(claim_id)
    assert snapshot._by_name == built._by_name
    assert snapshot._by_id == built._by_id


def test_a_republish_sharing_entries_patches_only_what_changed():
    kept, changed, gone = entry("t/kept", "sb_1"), entry("t/c", "sb_2"), entry("t/gone", "sb_3")
    others = (entry("t/o1"), entry("t/o2"))  # most of the publish is shared: it is patched
    first = inv("a", at(0), entries=(kept, changed, gone, *others))
    snapshot = FleetSnapshot.build([first, inv("b", at(0), entries=(entry("t/gone", "sb_9"),))])
    new_changed, added = entry("t/c", "sb_2", phase="Paused"), entry("t/new", "sb_4")
    record, changes = snapshot.record("a").revised(
        inv("a", at(1), entries=(kept, new_changed, added, *others))
    )
    assert changes.names_gone == {("t", "gone")}
    assert changes.names_added == {("t", "new")}
    assert changes.ids_gone == {"sb_3"}
    assert changes.ids_added == {"sb_4"}
    assert record.by_name[("t", "c")] is new_changed
    assert record.by_name[("t", "kept")] is kept
    view = snapshot.replace(record.inventory).view(RULE, at(1))
    assert view.lookup_name("t", "gone") == [Located("b", entry("t/gone", "sb_9"))]
    assert view.lookup_claim_id("sb_4") == Located("a", added)


def test_a_republish_that_claims_a_held_name_twice_answers_the_first_in_publish_order():
    first, again = entry("t/x", "sb_1"), entry("t/x", "sb_2")
    snapshot = FleetSnapshot.build([inv("a", at(0), entries=(first,))])
    snapshot = snapshot.replace(inv("a", at(1), entries=(first, again)))
    view = snapshot.view(RULE, at(1))
    assert view.lookup_name("t", "x") == [Located("a", first)]
    assert view.lookup_claim_id("sb_2") == Located("a", again)
    snapshot = snapshot.replace(inv("a", at(2), entries=(again,)))
    assert snapshot.view(RULE, at(2)).lookup_name("t", "x") == [Located("a", again)]
    assert snapshot.view(RULE, at(2)).lookup_claim_id("sb_1") is None


@quick
@given(
    publishes=st.lists(
        st.tuples(st.sampled_from(NODES), st.integers(0, 900), st.integers(0, 900)),
        max_size=12,
    ),
    now=st.integers(0, 1000),
)
def test_state_and_fresh_nodes_agree_with_stall_credit(publishes, now):
    snapshot = FleetSnapshot.empty(stall_after=sec(30))
    for node, stamp, seen in sorted(publishes, key=lambda p: p[2]):
        snapshot = snapshot.replace(inv(node, at(stamp)), seen_at=float(seen))
    view = snapshot.view(RULE, at(now))
    fresh = view.fresh_nodes()
    for node in snapshot.nodes:
        assert (node in fresh) == (view.state(node) is not NodeState.STALE)
        age = view.age(node)
        assert age is not None
        assert (node in fresh) == (age <= RULE.stale_after)
