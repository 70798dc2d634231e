"""The lock: every dependency the project names is pinned in lock/studio.txt, within the range pyproject.toml
allows, and the environment the tests run in is the one the lock describes (so a green run means the lock's
versions passed)."""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCK = ROOT / "lock" / "studio.txt"


def locked() -> dict[str, Version]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"lock/studio.txt pins with ==: {line!r}"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def named_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = [Requirement(text) for text in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        named += [Requirement(text) for text in extra if not text.startswith("mas[")]
    return named


def test_every_named_dependency_is_pinned_within_its_range():
    pins = locked()
    for requirement in named_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is in pyproject.toml but not in lock/studio.txt: bash scripts/lock.sh"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"lock/studio.txt pins {name}=={pins[name]}, outside pyproject.toml's {requirement}"
        )


def test_the_environment_is_the_locked_one():
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in importlib.metadata.distributions()}
    drift = {
        name: (str(version), str(installed.get(name)))
        for name, version in locked().items()
        if installed.get(name) != version
    }
    assert not drift, f"installed packages differ from lock/studio.txt (locked, installed): {drift}"
