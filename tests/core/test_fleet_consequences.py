"""What the rule means for a fleet (docs/configuration.md), read through the real snapshot.

Each test drives FleetSnapshot + FreshnessRule by hand, one read per second, with publishes
on a fixed schedule: node i of n publishes at i*interval/n and every interval after.
"""

from __future__ import annotations

from datetime import timedelta

from sandboxctl.core.freshness import FreshnessRule, NodeState, ReferenceMode
from sandboxctl.core.model import PoolKey
from sandboxctl.core.snapshot import FleetSnapshot, WarmCandidate
from tests.core.fleet_factory import T0, at, entry, inv, pool, sec

PUBLISH = FreshnessRule()
EXTRAPOLATE = FreshnessRule(mode=ReferenceMode.EXTRAPOLATE)  # 90s over 30s: valid


def run_fleet(rule, nodes, until, *, dead_from=None, outage=None, stall_credit=False):
    """Read the fleet every second from 0 to ``until``; return {second: fresh nodes}.

    ``dead_from`` maps a node to the second from which it no longer publishes; ``outage``
    is a (start, end) span in which no publish lands. Every publish stamps the true time.
    ``stall_credit`` builds the snapshot with ``stall_after`` = the publish interval.
    """
    dead_from = dead_from or {}
    interval = int(rule.publish_interval.total_seconds())
    offsets = {node: i * interval // len(nodes) for i, node in enumerate(nodes)}
    snapshot = FleetSnapshot.empty(rule.publish_interval if stall_credit else None)
    seen = {}
    for second in range(until + 1):
        for node in nodes:
            publishes = second >= offsets[node] and (second - offsets[node]) % interval == 0
            alive = second < dead_from.get(node, until + 1)
            blocked = outage is not None and outage[0] <= second < outage[1]
            if publishes and alive and not blocked:
                stamp = at(second)
                entries = (entry(f"team/{node}-box", f"sb_{node}"),)
                pools = (pool("python", 1),)
                snapshot = snapshot.replace(
                    inv(node, stamp, address=f"{node}:7777", pools=pools, entries=entries),
                    seen_at=float(second),
                )
        seen[second] = snapshot.view(rule, at(second), float(second)).fresh_nodes()
    return seen, snapshot


def first_second_without(seen, node, after):
    return next(s for s in sorted(seen) if s > after and node not in seen[s])


def test_a_ten_minute_write_outage_drops_nobody_while_it_lasts():
    nodes = ["a", "b", "c"]
    seen, snapshot = run_fleet(PUBLISH, nodes, until=659, outage=(60, 660))
    assert all(seen[s] == nodes for s in range(20, 660))
    view = snapshot.view(PUBLISH, at(659))
    for node in nodes:
        assert [loc.node for loc in view.lookup_name("team", f"{node}-box")] == [node]
        assert view.lookup_claim_id(f"sb_{node}") is not None
    assert [c.node for c in view.warm_candidates(PoolKey.of("python"))] == nodes


def test_with_stall_credit_the_end_of_a_ten_minute_outage_drops_nobody():
    nodes = ["a", "b", "c"]
    for rule in (PUBLISH, EXTRAPOLATE):
        seen, _ = run_fleet(rule, nodes, until=900, outage=(60, 660), stall_credit=True)
        assert all(seen[s] == nodes for s in range(20, 901)), rule.mode


def test_without_stall_credit_the_first_publish_after_an_outage_drops_the_rest_for_a_while():
    # The bare rule: a's stamp at 660 s is the reference; b (last 40 s) and
    # c (last 50 s) are 600+ s behind it until their own next publish at 670 s and 680 s.
    seen, _ = run_fleet(PUBLISH, ["a", "b", "c"], until=700, outage=(60, 660))
    assert seen[659] == ["a", "b", "c"]
    assert seen[660] == ["a"]
    assert seen[670] == ["a", "b"]
    assert seen[680] == ["a", "b", "c"]


def test_with_stall_credit_a_node_dead_before_an_outage_still_leaves_after_it():
    # b's last publish is 40 s; the outage's 580 s beyond one interval are credited to it,
    # so it goes once live stamps pass 40 + 580 + 90 = 710 s: a's publish at 720 s.
    nodes = ["a", "b", "c"]
    seen, _ = run_fleet(
        PUBLISH, nodes, until=900, dead_from={"b": 45}, outage=(60, 660), stall_credit=True
    )
    assert all("b" in seen[s] for s in range(10, 720))
    assert all(seen[s] == ["a", "c"] for s in range(720, 901))


def test_a_stamp_an_hour_ahead_evicts_neither_the_others_nor_itself():
    rogue = inv("rogue", at(3600))
    snapshot = FleetSnapshot.build([inv("a", T0), inv("b", T0), rogue])
    for second in range(0, 300, 30):  # the honest nodes keep publishing; the rogue too
        snapshot = snapshot.replace(inv("a", at(second))).replace(inv("b", at(second)))
        snapshot = snapshot.replace(inv("rogue", at(3600 + second)))
        view = snapshot.view(PUBLISH, at(second))
        assert view.fresh_nodes() == ["a", "b", "rogue"]
        assert view.state("rogue") is NodeState.AHEAD
        assert view.reference.at == at(second)


def test_a_fleet_whose_nodes_all_stop_keeps_its_last_inventory():
    nodes = ["a", "b", "c"]
    for rule in (PUBLISH, EXTRAPOLATE):
        seen, snapshot = run_fleet(rule, nodes, until=400, dead_from=dict.fromkeys(nodes, 100))
        assert all(seen[s] == nodes for s in range(20, 401))
        # ... and still, a day later.
        assert snapshot.view(rule, at(86400), 86400.0).fresh_nodes() == nodes


def test_a_one_node_fleet_keeps_its_inventory_forever():
    only = inv("solo", T0, address="solo:1", pools=(pool("python", 2),))
    snapshot = FleetSnapshot.build([only], seen_at=0.0)
    for rule in (PUBLISH, EXTRAPOLATE):
        view = snapshot.view(rule, T0 + timedelta(days=365), 365 * 86400.0)
        assert view.fresh_nodes() == ["solo"]
        assert view.inventory("solo") is only
        assert view.warm_candidates(PoolKey.of("python")) == [WarmCandidate("solo", "solo:1", 2)]


def test_a_dead_node_leaves_between_stale_after_and_one_interval_more_in_publish_mode():
    # a, b, c publish at 0/10/20 s and every 30 s; b's last publish is at 40 s. It goes when
    # the first live stamp later than 40 + 90 = 130 s lands: c's publish at 140 s.
    seen, _ = run_fleet(PUBLISH, ["a", "b", "c"], until=300, dead_from={"b": 45})
    assert all("b" in seen[s] for s in range(10, 140))
    left = first_second_without(seen, "b", after=40)
    assert left == 140
    assert sec(90) < sec(left - 40) <= sec(90) + PUBLISH.publish_interval
    assert all("b" not in seen[s] for s in range(left, 301))
    assert all(seen[s] == ["a", "c"] for s in range(left, 301))


def test_a_dead_node_is_kept_at_exactly_stale_after_behind_a_live_publisher():
    # A dead node against a live publisher, 90 s kept, 91 s dropped.
    snapshot = FleetSnapshot.build([inv("dead", T0), inv("live", at(90))])
    assert snapshot.view(PUBLISH, at(90)).fresh_nodes() == ["dead", "live"]
    snapshot = snapshot.replace(inv("live", at(91)))
    assert snapshot.view(PUBLISH, at(91)).fresh_nodes() == ["live"]


def test_custom_window_of_10s_drops_a_node_11s_behind():
    rule = FreshnessRule(stale_after=sec(10))
    snapshot = FleetSnapshot.build([inv("dead", T0), inv("live", at(10))])
    assert snapshot.view(rule, at(10)).fresh_nodes() == ["dead", "live"]
    assert snapshot.replace(inv("live", at(11))).view(rule, at(11)).fresh_nodes() == ["live"]


def test_a_dead_node_leaves_within_stale_after_plus_one_read_in_extrapolate_mode():
    seen, _ = run_fleet(EXTRAPOLATE, ["a", "b", "c"], until=300, dead_from={"b": 45})
    assert all("b" in seen[s] for s in range(10, 131))
    left = first_second_without(seen, "b", after=40)
    assert left == 131  # last publish 40 s, gone at the first read more than 90 s later
    assert all(seen[s] == ["a", "c"] for s in range(left, 301))


def test_an_hour_long_outage_drops_nobody_in_extrapolate_mode():
    nodes = ["a", "b", "c"]
    seen, _ = run_fleet(EXTRAPOLATE, nodes, until=3659, outage=(60, 3660))
    assert all(seen[s] == nodes for s in range(20, 3660))


def test_an_unstamped_node_is_fresh_beside_stamped_ones_however_old_they_get():
    snapshot = FleetSnapshot.build([inv("old-publisher"), inv("a", T0)])
    snapshot = snapshot.replace(inv("a", at(86400)))
    view = snapshot.view(PUBLISH, at(86400))
    assert view.fresh_nodes() == ["a", "old-publisher"]
    assert view.state("old-publisher") is NodeState.UNSTAMPED
