"""SandboxId: either spelling parses, both render, equality by the public one."""

from __future__ import annotations

from sandboxctl.core.ids import SandboxId


def test_a_public_id_parses_to_the_agents_spelling() -> None:
    parsed = SandboxId.parse("sb-0a0a")
    assert (parsed.public, parsed.claim, parsed.spellings) == (
        "sb-0a0a",
        "sb_0a0a",
        ("sb_0a0a", "sb-0a0a"),
    )


def test_a_claim_id_renders_dns_safe() -> None:
    claim = SandboxId.of_claim("sb_0A.0a")
    assert (claim.public, claim.claim, str(claim)) == ("sb-0a-0a", "sb_0A.0a", "sb-0a-0a")
    assert claim.spellings == ("sb_0A.0a",)


def test_two_spellings_name_one_sandbox() -> None:
    assert SandboxId.parse("sb-0a0a") == SandboxId.parse("sb_0a0a") == SandboxId.of_claim("sb_0a0a")
    assert hash(SandboxId.parse("sb-0a0a")) == hash(SandboxId.of_claim("sb_0a0a"))
    assert SandboxId.parse("sb-0a0a") != SandboxId.parse("sb-0a0b")
    assert SandboxId.parse("sb-0a-0a").names("sb_0A.0a")
    assert not SandboxId.parse("sb-0a0a").names("sb_0a0b")


def test_an_id_of_another_form_is_kept_as_given() -> None:
    other = SandboxId.parse("other-id")
    assert (other.claim, other.public, other.spellings) == ("other-id", "other-id", ("other-id",))
