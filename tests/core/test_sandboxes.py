"""The Sandbox object as served (docs/api.md): every field, labels."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxctl.core.model import NO_METADATA, Entry, Metadata
from sandboxctl.core.sandboxes import (
    ANNOTATION_CLAIM_ID,
    ANNOTATION_CPU_COUNT,
    ANNOTATION_DEADLINE,
    ANNOTATION_MEMORY_BYTES,
    ANNOTATION_METADATA,
    API_VERSION,
    KIND,
    LABEL_CLAIM,
    LABEL_NODE,
    LABEL_PHASE,
    LABEL_TEMPLATE,
    addr_host,
    is_label_value,
    sandbox_fields,
    sandbox_labels,
    sandbox_object,
)
from sandboxctl.core.snapshot import Located
from tests.core.fleet_factory import T0, at, quick

DEADLINE = at(3600)  # 2026-09-27T10:00:00Z
METADATA = Metadata.parse(json.dumps({"owner": "ana"}, separators=(",", ":")))


def full_entry(**changes: Any) -> Entry:
    base = Entry(
        name="team/notebook",
        phase="Running",
        id="sb_01",
        template="python",
        claim_ref="team/claim-1",
        addr="10.0.0.7:49983",
        deadline=DEADLINE,
        claimed_at=T0,
        metadata=METADATA,
        cpu_count=2,
        memory_bytes=1073741824,
    )
    return msgspec.structs.replace(base, **changes)


def served(entry: Entry, node: str = "node-a") -> dict[str, Any]:
    return sandbox_object(Located(node, entry), "7")


# --- FNV-1a 64 ----------------------------------------------------------------------------------


# --- the whole object ---------------------------------------------------------------------------


def test_a_full_entry_serves_every_field() -> None:
    entry = full_entry()
    assert served(entry) == {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "name": "notebook",
            "namespace": "team",
            "creationTimestamp": "2026-09-27T09:00:00Z",
            "resourceVersion": "7",
            "labels": {
                "sandbox.cocoonstack.io/node": "node-a",
                "sandbox.cocoonstack.io/phase": "Running",
                "sandbox.cocoonstack.io/template": "python",
                "sandbox.cocoonstack.io/claim": "claim-1",
            },
            "annotations": {
                "sandbox.cocoonstack.io/claim-id": "sb-01",  # the SDK's spelling of sb_01
                "sandbox.cocoonstack.io/deadline": "2026-09-27T10:00:00Z",
                "sandbox.cocoonstack.io/metadata": '{"owner":"ana"}',
                "sandbox.cocoonstack.io/cpu-count": "2",
                "sandbox.cocoonstack.io/memory-bytes": "1073741824",
            },
        },
        "status": {
            "nodeName": "node-a",
            "podIPs": [{"ip": "10.0.0.7"}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Running",
                    "message": 'phase "Running" reported by node "node-a" inventory',
                }
            ],
        },
    }


def test_the_constants_name_the_documented_keys() -> None:
    constants = {
        API_VERSION: "agents.x-k8s.io/v1beta1",
        KIND: "Sandbox",
        LABEL_NODE: "sandbox.cocoonstack.io/node",
        LABEL_PHASE: "sandbox.cocoonstack.io/phase",
        LABEL_TEMPLATE: "sandbox.cocoonstack.io/template",
        LABEL_CLAIM: "sandbox.cocoonstack.io/claim",
        ANNOTATION_CLAIM_ID: "sandbox.cocoonstack.io/claim-id",
        ANNOTATION_DEADLINE: "sandbox.cocoonstack.io/deadline",
        ANNOTATION_METADATA: "sandbox.cocoonstack.io/metadata",
        ANNOTATION_CPU_COUNT: "sandbox.cocoonstack.io/cpu-count",
        ANNOTATION_MEMORY_BYTES: "sandbox.cocoonstack.io/memory-bytes",
    }
    assert all(constant == text for constant, text in constants.items())


def test_a_bare_entry_serves_only_what_it_reports() -> None:
    obj = served(Entry(name="solo", phase="Hibernated"), node="node-b")
    assert obj["metadata"] == {
        "name": "solo",
        "namespace": "default",
        "resourceVersion": "7",
        "labels": {LABEL_NODE: "node-b", LABEL_PHASE: "Hibernated"},
    }
    assert obj["status"] == {
        "nodeName": "node-b",
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "Hibernated",
                "message": 'phase "Hibernated" reported by node "node-b" inventory',
            }
        ],
    }


def test_a_served_sandbox_has_no_uid() -> None:
    obj = served(full_entry())
    assert "uid" not in obj["metadata"]
    assert "uid" not in json.dumps(obj).lower()


def test_the_object_is_json_ready() -> None:
    obj = served(full_entry())
    assert json.loads(json.dumps(obj)) == obj


def test_creation_timestamp_is_claimed_at_in_utc() -> None:
    claimed = datetime(2026, 9, 27, 11, 30, 15, 900_000, tzinfo=timezone(timedelta(hours=2)))
    obj = served(full_entry(claimed_at=claimed))
    assert obj["metadata"]["creationTimestamp"] == "2026-09-27T09:30:15Z"


def test_each_annotation_appears_only_when_reported() -> None:
    obj = served(
        full_entry(id="", deadline=None, metadata=NO_METADATA, cpu_count=None, memory_bytes=0)
    )
    assert obj["metadata"]["annotations"] == {ANNOTATION_MEMORY_BYTES: "0"}


# --- labels and fields --------------------------------------------------------------------------


def test_the_claim_label_is_the_name_part_of_the_claim_ref() -> None:
    labels = sandbox_labels(Located("n", full_entry(claim_ref="other-ns/my-claim")))
    assert labels[LABEL_CLAIM] == "my-claim"


def test_a_claim_ref_without_a_namespace_labels_the_whole_ref() -> None:
    labels = sandbox_labels(Located("n", full_entry(claim_ref="my-claim")))
    assert labels[LABEL_CLAIM] == "my-claim"


def test_an_image_template_is_left_out_of_the_labels() -> None:
    entry = full_entry(template="ghcr.io/acme/python:3.11")
    labels = sandbox_labels(Located("n", entry))
    assert LABEL_TEMPLATE not in labels
    assert labels[LABEL_PHASE] == "Running"
    assert served(entry, node="n")["metadata"]["labels"] == labels


@pytest.mark.parametrize(
    ("field", "key"),
    [("phase", LABEL_PHASE), ("template", LABEL_TEMPLATE), ("claim_ref", LABEL_CLAIM)],
)
def test_an_empty_value_leaves_its_label_out(field: str, key: str) -> None:
    labels = sandbox_labels(Located("n", full_entry(**{field: ""})))
    assert key not in labels
    assert labels[LABEL_NODE] == "n"


def test_an_invalid_claim_name_or_phase_is_left_out_of_the_labels() -> None:
    labels = sandbox_labels(Located("n", full_entry(claim_ref="ns/" + "x" * 64, phase="Not ok")))
    assert labels == {LABEL_NODE: "n", LABEL_TEMPLATE: "python"}


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("", True),
        ("python", True),
        ("a.b_c-d", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("-lead", False),
        ("trail.", False),
        ("ghcr.io/acme/python:3.11", False),
        ("has space", False),
    ],
)
def test_label_value_validity(text: str, valid: bool) -> None:
    assert is_label_value(text) is valid


@quick
@given(st.text(max_size=80), st.text(max_size=80), st.text(max_size=80))
def test_optional_labels_are_always_valid_values(phase: str, template: str, claim: str) -> None:
    labels = sandbox_labels(Located("n", Entry("a/b", phase, template=template, claim_ref=claim)))
    assert all(is_label_value(v) and v for k, v in labels.items() if k != LABEL_NODE)


def test_fields_match_the_object() -> None:
    located = Located("node-a", full_entry())
    obj = sandbox_object(located, "7")
    assert sandbox_fields(located) == {
        "metadata.name": obj["metadata"]["name"],
        "metadata.namespace": obj["metadata"]["namespace"],
        "status.nodeName": obj["status"]["nodeName"],
    }
    assert sandbox_fields(Located("b", Entry("solo", "Running"))) == {
        "metadata.name": "solo",
        "metadata.namespace": "default",
        "status.nodeName": "b",
    }


# --- Ready --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "status", "reason"),
    [
        ("Running", "True", "Running"),
        ("running", "True", "running"),
        ("Ready", "True", "Ready"),
        ("READY", "True", "READY"),
        ("Hibernated", "False", "Hibernated"),
        ("Paused", "False", "Paused"),
        ("", "False", "Unknown"),
    ],
)
def test_the_ready_condition(phase: str, status: str, reason: str) -> None:
    (condition,) = served(full_entry(phase=phase), node="n1")["status"]["conditions"]
    assert condition == {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": f'phase "{phase}" reported by node "n1" inventory',
    }


# --- podIPs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addr", "host"),
    [
        ("10.0.0.7:49983", "10.0.0.7"),
        ("10.0.0.7", "10.0.0.7"),
        ("[fd00::7]:49983", "fd00::7"),
        ("fd00::7", "fd00::7"),
        ("http://10.0.0.7:7777", "10.0.0.7"),
        ("https://host.example:443/base", "host.example"),
        ("", ""),
    ],
)
def test_addr_host(addr: str, host: str) -> None:
    assert addr_host(addr) == host


def test_pod_ips_are_left_out_without_an_addr() -> None:
    assert "podIPs" not in served(full_entry(addr=""))["status"]


# --- resourceVersion ----------------------------------------------------------------------------


def test_the_resource_version_is_the_one_given() -> None:
    obj = sandbox_object(Located("node-a", full_entry()), "1234")
    assert obj["metadata"]["resourceVersion"] == "1234"


def test_the_same_entry_and_version_serve_the_same_object() -> None:
    assert served(full_entry(), "a") == served(full_entry(), "a")
