"""SBL-09 and SBL-10: how a replica resolves one sandbox (docs/lanes.md).

SBL-09: an e2b read by id right after the create, on the replica that created it, asks
only the owning node. Each sample scrapes both agents' ``sandboxd_requests_total`` on
their per-sandbox routes (``/v1/sandboxes/{sandbox_id}...``: only reads and verbs of one
sandbox use them) before the create and after the read; the other agent's count must not
move, and the owner's must (the read reached it, so the count can see a request).

SBL-10: one name claimed on both hosts through their agents, the claim on the host first
in node-name order (the one sandboxctl's reads resolve a duplicate name to,
docs/api.md#duplicates) read by name through replica 1 at once, so that the owning-node
index holds it too, then hibernated (Paused); the claim on the other host stays Running.
A pinned list (namespaced, ``fieldSelector=metadata.name=<name>``) selecting
``phase=Running`` must answer the Running claim."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx

from sandboxctl.agentapi import ClaimGrant
from sandboxctl.core.ids import SandboxId
from sandboxctl.lanes import observe
from sandboxctl.lanes.kit import Host, Kit, Replica
from sandboxctl.lanes.model import Lane, Progress, Verdict

SAMPLES = 6  # reads judged per run
CLAIM_ID = "sandbox.cocoonstack.io/claim-id"
RUNNING = "Running"

READ_BY_ID = Lane(
    id="SBL-09",
    group="SBL",
    proves="an e2b read by id right after the create asks only the node that owns the sandbox",
)
PINNED_DUPLICATE = Lane(
    id="SBL-10",
    group="SBL",
    proves="with one name claimed on both nodes, a pinned list selecting phase=Running "
    "answers the Running claim, not the Paused one the name resolves to",
)


# --- SBL-09 ------------------------------------------------------------------------------


@dataclass
class Sample:
    created: int | None  # HTTP status of the create (None: no answer)
    read: int | None  # of the read by id
    owner: str = ""  # clientID of the create
    owner_asked: int = 0  # requests the owner answered on per-sandbox routes meanwhile
    other_asked: int = 0  # and the other node


def judge_read_by_id(samples: list[Sample]) -> Verdict:
    good = [s for s in samples if s.created == 201 and s.read == 200]
    other = [s for s in good if s.other_asked]
    reached = [s for s in good if s.owner_asked]
    figure = (
        f"the other node asked in {len(other)} of {len(good)} samples "
        f"({sum(s.other_asked for s in good)} requests); the owner in {len(reached)} of "
        f"{len(good)}"
    )
    bound = f"the other node in 0 of {SAMPLES}; every create 201 and read 200"
    problems = []
    if len(good) < SAMPLES:
        bad = next((s for s in samples if s not in good), None)
        answered = "none" if bad is None else f"create {bad.created}, read {bad.read}"
        problems.append(f"{len(good)} of {SAMPLES} samples created and read ({answered})")
    if other:
        problems.append(f"the other node was asked in {len(other)} samples")
    if len(reached) < len(good):
        problems.append("the owner's count did not move: the read did not reach it")
    return Verdict(READ_BY_ID.id, not problems, figure, bound, "; ".join(problems))


# --- SBL-10 ------------------------------------------------------------------------------


@dataclass
class Pinned:
    status: int | None
    items: list[tuple[str, str]] = field(default_factory=list)  # (node, claim id)
    running: tuple[str, str] = ("", "")  # the Running claim: (node, claim id)
    paused: tuple[str, str] = ("", "")
    resolved: str = ""  # the node a get by name answered before the second claim


def judge_pinned(pinned: Pinned) -> Verdict:
    shown = ", ".join(f"{node} {claim}" for node, claim in pinned.items) or "[]"
    figure = f"the pinned list answered {shown}"
    if pinned.status != 200:
        figure = f"the pinned list answered HTTP {pinned.status}"
    node, claim = pinned.running
    bound = f"the Running claim ({node} {claim}) alone"
    passed = pinned.status == 200 and pinned.items == [pinned.running]
    paused_node, paused_claim = pinned.paused
    detail = (
        f"the Paused claim is {paused_node} {paused_claim}; the name resolved to "
        f"{pinned.resolved or 'nothing'} before the Running claim was made"
    )
    return Verdict(PINNED_DUPLICATE.id, passed, figure, bound, detail)


class Resolution:
    lanes: tuple[Lane, ...] = (READ_BY_ID, PINNED_DUPLICATE)

    def run(self, kit: Kit, selected: frozenset[str], progress: Progress) -> Iterable[Verdict]:
        if READ_BY_ID.id in selected:
            yield judge_read_by_id(self.read_by_id(kit, progress))
        if PINNED_DUPLICATE.id in selected:
            yield judge_pinned(self.pinned_duplicate(kit, progress))

    def read_by_id(self, kit: Kit, progress: Progress) -> list[Sample]:
        replica = kit.replicas[0]
        hosts = {kit.a.node: kit.a, kit.b.node: kit.b}
        samples = []
        for i in range(SAMPLES):
            progress.note(f"SBL-09 sample {i + 1}: create, then read by id, on {replica.name}")
            before = {node: _asked(kit, host) for node, host in hosts.items()}
            with kit.e2b(replica) as client:
                created = client.post(
                    "/sandboxes", json={"templateID": kit.template, "timeout": 120}
                )
                if created.status_code != 201:
                    samples.append(Sample(created.status_code, None))
                    continue
                sandbox = created.json()
                read = client.get(f"/sandboxes/{sandbox['sandboxID']}")
                after = {node: _asked(kit, host) for node, host in hosts.items()}
                client.delete(f"/sandboxes/{sandbox['sandboxID']}")
            owner = str(sandbox.get("clientID"))
            delta = {node: after[node] - before[node] for node in hosts}
            samples.append(
                Sample(
                    201,
                    read.status_code,
                    owner,
                    delta.get(owner, 0),
                    sum(n for node, n in delta.items() if node != owner),
                )
            )
        return samples

    def pinned_duplicate(self, kit: Kit, progress: Progress) -> Pinned:
        replica = kit.replicas[0]
        first, second = sorted((kit.a, kit.b), key=lambda host: host.node)
        name = f"sbl10-{secrets.token_hex(3)}"
        ref = f"{observe.NAMESPACE}/{name}"
        grants: dict[str, tuple[Host, ClaimGrant]] = {}
        try:
            grants["paused"] = (first, _claim(kit, first, ref))
            with kit.kube(replica) as client:  # resolves it now: the index holds its node
                got = client.get(f"{observe.namespaced()}/{name}")
            resolved = got.json()["status"]["nodeName"] if got.status_code == 200 else ""
            with kit.agent(first) as agent:
                agent.hibernate(grants["paused"][1].id)
            grants["running"] = (second, _claim(kit, second, ref))
            states = {
                SandboxId.of_claim(grants["paused"][1].id).public: "paused",
                SandboxId.of_claim(grants["running"][1].id).public: "running",
            }
            progress.wait_for(
                f"{replica.name} to read both claims of {name}, one paused",
                lambda: states.items() <= _e2b_states(kit, replica).items(),
                2 * kit.windows.publish + 5,
            )
            progress.note(f"pinned list of {name} selecting phase={RUNNING} on {replica.name}")
            params = {
                "fieldSelector": f"metadata.name={name}",
                "labelSelector": f"{observe.PHASE_LABEL}={RUNNING}",
            }
            with kit.kube(replica) as client:
                answer = client.get(observe.namespaced(), params=params)
            pinned = Pinned(
                answer.status_code,
                # a served object shows the id as the SDK spells it
                running=(second.node, SandboxId.of_claim(grants["running"][1].id).public),
                paused=(first.node, SandboxId.of_claim(grants["paused"][1].id).public),
                resolved=resolved,
            )
            if answer.status_code == 200:
                pinned.items = [
                    (
                        item["status"]["nodeName"],
                        item["metadata"].get("annotations", {}).get(CLAIM_ID, ""),
                    )
                    for item in answer.json()["items"]
                ]
            return pinned
        finally:
            for host, grant in grants.values():
                observe.release(kit, host, {ref: grant})


def _claim(kit: Kit, host: Host, ref: str) -> ClaimGrant:
    with kit.agent(host) as agent:
        return observe.claim(kit, agent, host, ref)


def _asked(kit: Kit, host: Host) -> int:
    with kit.agent(host) as agent:
        return observe.per_sandbox_requests(agent.metrics())


def _e2b_states(kit: Kit, replica: Replica) -> dict[str, str]:
    """sandboxID -> state ("running" or "paused") of every sandbox the e2b API lists."""
    try:
        with kit.e2b(replica) as client:
            answer = client.get("/sandboxes", timeout=5)
        answer.raise_for_status()
        return {str(item["sandboxID"]): str(item["state"]) for item in answer.json()}
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return {}


SCENARIO = Resolution()
