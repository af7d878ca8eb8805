"""The test toolchain is locked: every package the tests need is pinned, and this run uses the pins.

requirements/test-constraints.txt is what scripts/test.sh installs with; scripts/lock.sh
re-resolves it deliberately. A dependency added to pyproject.toml without re-locking, or
an environment that drifted from the lock, fails here instead of on a fresh machine.
"""

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / "test-constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"test-constraints.txt: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = version
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in ("test", "service", "runtime", "gateway"):
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


def test_every_test_dependency_is_pinned_and_the_pin_satisfies_pyproject():
    pins = _lock()
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name == "torch":  # pinned in scripts/test.sh itself: the CPU wheel on disk
            continue
        assert name in pins, f"{req.name} is a test dependency but not in requirements/test-constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"{req.name}=={pins[name]} in the lock does not satisfy pyproject's {req}"


def test_this_environment_was_installed_from_the_lock():
    drift = []
    for name, version in _lock().items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            drift.append(f"{name}: locked {version}, not installed")
            continue
        if have != version:
            drift.append(f"{name}: locked {version}, installed {have}")
    assert not drift, "environment differs from requirements/test-constraints.txt:\n" + "\n".join(drift)
