"""Supply chain (issue 16, finding 5): every wheel the Lambda and Function packages ship
is checked against the SHA-256 recorded in ``stacks/wheels.sha256`` before it is packed,
and downloaded with ``pip --require-hashes``. A pin without a recorded hash (an unpinned
input) or a wheel whose bytes changed (a poisoned cache, a substituted file of the same
name) fails the build. Uses the real wheel cache that ``./run setup`` fills.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainguard.stacks import package

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


# --- the container image ---------------------------------------------------------------

CONTAINERFILE = package.ROOT / "Containerfile"


def test_the_container_lock_pins_every_requirement_by_hash() -> None:
    assert package.unpinned(package.CONTAINER_LOCK) == []


def test_the_container_lock_holds_the_runtime_dependencies() -> None:
    import re
    import tomllib

    project = tomllib.loads((package.ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["kubernetes"]]
    locked = {re.split(r"==", ln, maxsplit=1)[0].lower().replace("_", "-")
              for ln in package.CONTAINER_LOCK.read_text().splitlines()
              if re.match(r"^[A-Za-z0-9]", ln)}
    for dep in wanted:
        name = re.split(r"[<>=~!\[ ]", dep, maxsplit=1)[0].lower().replace("_", "-")
        assert name in locked, f"{dep} is not in {package.CONTAINER_LOCK}"


def test_the_container_installs_only_from_the_lock() -> None:
    text = CONTAINERFILE.read_text()
    installs = [ln for ln in text.replace("\\\n", " ").splitlines() if "pip install" in ln]
    assert len(installs) == 1, installs
    (install,) = installs
    assert "--require-hashes" in install and "-r requirements.txt" in install
    assert "COPY requirements/container.txt ./requirements.txt" in text


@pytest.mark.parametrize(("line", "why"), [
    ("numpy>=1.26\n", "is not pinned to one version"),
    ("numpy==2.4.6\n", "has no --hash=sha256:"),
    ("--index-url https://mirror.example/simple\nnumpy==2.4.6 \\\n    --hash=sha256:" + "a" * 64
     + "\n", "option '--index-url'"),
])
def test_an_unpinned_container_input_is_caught(tmp_path: Path, line: str, why: str) -> None:
    lock = tmp_path / "container.txt"
    lock.write_text("# header\n" + line)
    (problem,) = package.unpinned(lock)
    assert problem.startswith(f"{lock}:2:") and why in problem


def test_every_base_image_is_pinned_by_digest() -> None:
    """A tag (``:latest``, ``:9.4``) can be moved to another image; a digest cannot."""
    froms = [ln.split()[1] for ln in CONTAINERFILE.read_text().splitlines()
             if ln.strip().upper().startswith("FROM ")]
    assert froms
    for image in froms:
        assert re.fullmatch(r"[\w.\-/:]+@sha256:[0-9a-f]{64}", image), \
            f"{CONTAINERFILE.name}: FROM {image} is not pinned by @sha256 digest"
