"""Template specs, their digests and names, and which Debian mirror a build uses."""

from __future__ import annotations

import pytest

from sandboxctl.core.aptsources import mirror_lines, parse_deb822, parse_one_line
from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.core.templates import (
    REQUIRED_PACKAGES,
    build_id,
    check_template_name,
    split_packages,
    template_spec,
)

TOOL = "mmdebstrap 1.3.5"

# This machine's own /etc/apt/sources.list.d/debian.sources, as Debian 12 installs it.
DEBIAN_SOURCES = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
NODESOURCE = """\
Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
"""


def test_a_spec_is_normalized_and_always_has_what_the_runtime_needs() -> None:
    spec = template_spec("bookworm", ("procps", "curl", "procps"))
    assert spec.packages == tuple(sorted({"curl", "procps", *REQUIRED_PACKAGES}))
    assert template_spec().packages == REQUIRED_PACKAGES


def test_the_digest_names_suite_packages_run_commands_and_tool() -> None:
    spec = template_spec("bookworm", ("procps",), ("echo one",))
    digest = spec.digest(TOOL)
    assert len(digest) == 64
    assert digest == template_spec("bookworm", ("procps", "procps"), ("echo one",)).digest(TOOL)
    others = {
        template_spec("trixie", ("procps",), ("echo one",)).digest(TOOL),
        template_spec("bookworm", ("procps", "curl"), ("echo one",)).digest(TOOL),
        template_spec("bookworm", ("procps",), ("echo two",)).digest(TOOL),
        template_spec("bookworm", ("procps",), ("echo one", "true")).digest(TOOL),
        spec.digest("mmdebstrap 1.4.0"),
        spec.base().digest(TOOL),
    }
    assert digest not in others
    assert len(others) == 6
    assert spec.base() == template_spec("bookworm", ("procps",))


def test_run_commands_keep_their_order() -> None:
    first = template_spec(run=("a", "b")).digest(TOOL)
    assert first != template_spec(run=("b", "a")).digest(TOOL)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"suite": "Bookworm"}, "--suite 'Bookworm': not a Debian suite name"),
        ({"suite": "../etc"}, "--suite '../etc': not a Debian suite name"),
        ({"packages": ("Python3",)}, "--packages: 'Python3' is not a Debian package name"),
        ({"packages": ("?essential",)}, "--packages: '?essential' is not a Debian package name"),
        ({"packages": ("a",)}, "--packages: 'a' is not a Debian package name"),
        ({"run": ("  ",)}, "--run: the command is empty"),
        ({"run": ("echo\0",)}, "--run: the command contains a NUL byte"),
    ],
)
def test_bad_spec_input_names_the_flag(args: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidValueError) as raised:
        template_spec(**args)  # type: ignore[arg-type]
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("name", ["py", "node-20", "a", "x" * 63, "0web"])
def test_dns_labels_are_template_names(name: str) -> None:
    assert check_template_name(name) == name


@pytest.mark.parametrize("name", ["Py", "py_3", "-py", "py-", "", "x" * 64, "a.b", "py/3"])
def test_other_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidValueError, match="is not a DNS label"):
        check_template_name(name)


def test_base_is_the_host_root_and_no_template_name() -> None:
    with pytest.raises(InvalidValueError, match="host's root filesystem"):
        check_template_name("base")


def test_packages_split_on_commas_and_spaces() -> None:
    assert split_packages("python3,nodejs  git, ") == ("python3", "nodejs", "git")


def test_a_build_id_is_a_uuid_of_the_digest() -> None:
    digest = template_spec().digest(TOOL)
    assert build_id(digest).replace("-", "") == digest[:32]


def test_the_host_suite_gets_the_host_entries_with_updates_and_security() -> None:
    sources = parse_deb822(DEBIAN_SOURCES + "\n" + NODESOURCE)
    assert mirror_lines(sources, "bookworm", "apt") == [
        "deb http://deb.debian.org/debian bookworm main",
        "deb http://deb.debian.org/debian bookworm-updates main",
        "deb http://deb.debian.org/debian-security bookworm-security main",
    ]


def test_another_suite_gets_the_main_archive_only() -> None:
    sources = parse_deb822(NODESOURCE + "\n" + DEBIAN_SOURCES)
    assert mirror_lines(sources, "trixie", "apt") == [
        "deb http://deb.debian.org/debian trixie main"
    ]


def test_one_line_sources_with_options_and_comments() -> None:
    text = (
        "# deb http://old.example/debian bookworm main\n"
        "deb-src http://mirror.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
        "http://mirror.example/pub/linux bookworm main contrib  # a comment\n"
        "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
    )
    sources = parse_one_line(text)
    assert len(sources) == 2
    assert mirror_lines(sources, "bookworm", "apt") == [
        "deb http://mirror.example/pub/linux bookworm main contrib"
    ]


def test_disabled_stanzas_and_inline_keys() -> None:
    text = (
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb deb-src\nURIs: http://on.example/debian/\nSuites: bookworm\n"
        "Components: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n"
        " -----END PGP PUBLIC KEY BLOCK-----\n"
    )
    sources = parse_deb822(text)
    assert [s.uri for s in sources] == ["http://on.example/debian/"]
    assert mirror_lines(sources, "bookworm", "apt") == [
        "deb http://on.example/debian/ bookworm main"
    ]


def test_no_debian_mirror_is_one_line_naming_the_files() -> None:
    with pytest.raises(ConfigurationError, match=r"no Debian mirror in /etc/apt/sources\.list"):
        mirror_lines(parse_deb822(NODESOURCE), "bookworm", "/etc/apt/sources.list*")
