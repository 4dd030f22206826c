"""Where homes are, and removing those of no sandbox (plain directories, no sandboxes)."""

from __future__ import annotations

from pathlib import Path

from sandboxctl.sandboxd.homes import Homes
from sandboxctl.sandboxd.runtimedir import HOMES


def test_homes_are_in_the_runtime_dir_traversable_by_sandbox_uids(tmp_path: Path) -> None:
    homes = Homes(tmp_path / "runtime", tmp_path / "state")
    assert homes.path("sb_1") == tmp_path / "runtime" / HOMES / "sb_1"
    assert (homes.directory.stat().st_mode & 0o777) == 0o711


def test_a_sandbox_from_an_older_agent_keeps_its_home_in_the_state_dir(tmp_path: Path) -> None:
    old = tmp_path / "state" / HOMES
    old.mkdir(parents=True)
    (old / "sb_old.passwd").write_text("")
    homes = Homes(tmp_path / "runtime", tmp_path / "state")
    homes.find_old(["sb_old", "sb_new"])
    assert homes.path("sb_old") == old / "sb_old"
    assert homes.path("sb_new") == tmp_path / "runtime" / HOMES / "sb_new"
    homes.ended("sb_old")
    assert homes.path("sb_old") == tmp_path / "runtime" / HOMES / "sb_old"


def test_what_belongs_to_no_sandbox_is_removed_and_an_emptied_old_dir_goes(
    tmp_path: Path,
) -> None:
    old = tmp_path / "state" / HOMES
    old.mkdir(parents=True)
    (old / "sb_gone.passwd").write_text("")
    homes = Homes(tmp_path / "runtime", tmp_path / "state")
    for name in ("sb_keep", "sb_left"):
        (homes.directory / name).mkdir()
        (homes.directory / f"{name}.passwd").write_text("")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("")
    (homes.directory / "sb_left" / "link").symlink_to(outside)
    homes.remove_others({"sb_keep"})
    assert sorted(p.name for p in homes.directory.iterdir()) == ["sb_keep", "sb_keep.passwd"]
    assert not old.exists()
    assert (outside / "precious").exists()  # a link a sandbox left is not followed


def test_removing_a_home_takes_its_files_beside_it(tmp_path: Path) -> None:
    homes = Homes(tmp_path / "runtime", tmp_path / "state")
    (homes.directory / "sb_1").mkdir()
    for suffix in (".passwd", ".group", ".hosts", ".passwd.tmp", ".hosts.tmp"):
        (homes.directory / f"sb_1{suffix}").write_text("")
    (homes.directory / "sb_2.passwd").write_text("")
    homes.remove("sb_1")
    assert [p.name for p in homes.directory.iterdir()] == ["sb_2.passwd"]
