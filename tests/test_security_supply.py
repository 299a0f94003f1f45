"""Supply chain (issue 16, finding 5): every wheel the Lambda and Function packages ship
is checked against the SHA-256 recorded in ``stacks/wheels.sha256`` before it is packed,
and downloaded with ``pip --require-hashes``. A pin without a recorded hash (an unpinned
input) or a wheel whose bytes changed (a poisoned cache, a substituted file of the same
name) fails the build. Uses the real wheel cache that ``./run setup`` fills.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from stacks import package

PACKAGES = (package.LambdaPackage(), package.FunctionPackage())


@pytest.fixture
def jmespath_wheel() -> Path:
    found = package._matches(package.wheel_cache(), "jmespath==1.1.0")
    if not found:
        pytest.skip(f"no jmespath wheel in {package.wheel_cache()} (./run setup fills it)")
    return found[0]


def test_every_shipped_pin_has_a_recorded_hash() -> None:
    lock = package.load_lock()
    for p in PACKAGES:
        for pin in p.wheels:
            assert any(package._is(name, pin) for name in lock), f"{p.kind}: {pin}"


def test_the_cached_wheels_are_the_recorded_ones() -> None:
    cache = package.wheel_cache()
    lock = package.load_lock()
    checked = 0
    for name, digest in lock.items():
        if (cache / name).is_file():
            assert package.sha256_of(cache / name) == digest, name
            checked += 1
    if not checked:
        pytest.skip(f"no wheel cache at {cache}")


def test_an_unpinned_input_fails_the_build(tmp_path: Path) -> None:
    @dataclass(frozen=True)
    class Sneaky(package.Package):
        kind = "Lambda"
        wheels = (*package.LambdaPackage.wheels, "requests==2.32.3")

    with pytest.raises(RuntimeError, match=r"unpinned input: no SHA-256 recorded for "
                                           r"requests==2\.32\.3"):
        Sneaky().fetch_wheels(tmp_path)


def test_a_wheel_whose_bytes_changed_is_refused(tmp_path: Path, jmespath_wheel: Path) -> None:
    @dataclass(frozen=True)
    class One(package.Package):
        kind = "Lambda"
        wheels = ("jmespath==1.1.0",)

    poisoned = tmp_path / jmespath_wheel.name
    shutil.copy(jmespath_wheel, poisoned)
    assert One().fetch_wheels(tmp_path) == [poisoned]  # the recorded bytes: accepted
    poisoned.write_bytes(poisoned.read_bytes() + b"\0")
    with pytest.raises(RuntimeError, match="is not the one recorded"):
        One().fetch_wheels(tmp_path)


def test_a_bad_lock_line_names_the_file_and_line(tmp_path: Path) -> None:
    lock = tmp_path / "wheels.sha256"
    lock.write_text("# header\nnot-a-hash  x.whl\n")
    with pytest.raises(RuntimeError, match=r"wheels.sha256:2: expected"):
        package.load_lock(lock)
