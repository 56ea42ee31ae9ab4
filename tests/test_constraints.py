"""constraints.txt pins every package `make install` puts in .venv, torch aside (TORCH_PIN chooses it)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LEFT_TO_TORCH_PIN = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*)$")


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not an exact pin (name==version)"
            out[canonicalize_name(name)] = version
    return out


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *(r for group in project["optional-dependencies"].values() for r in group)]
    names = {canonicalize_name(Requirement(r).name) for r in requirements}
    return names - {canonicalize_name(project["name"])}


def test_every_declared_dependency_but_torch_is_pinned() -> None:
    locked = pins()
    missing = sorted(n for n in declared() if n not in locked and not LEFT_TO_TORCH_PIN.match(n))
    assert not missing, f"not in constraints.txt (run `make lock`): {missing}"
    assert not [n for n in locked if LEFT_TO_TORCH_PIN.match(n)], "torch's build is TORCH_PIN's, not the lock's"


def test_the_environment_holds_the_pinned_releases() -> None:
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    stale = {n: (installed[n], v) for n, v in pins().items() if n in installed and installed[n] != v}
    assert not stale, f"installed != constraints.txt (rebuild with `make install`): {stale}"
