"""The AWS Lambda package: a reproducible zip of the watchdog's code, one environment's
policy and the wheels the Lambda needs beyond the runtime's own boto3.

Reproducible: entries are sorted, every timestamp is 1980-01-01, every mode 0644, and
the wheels are pinned exactly (``--no-deps``: the list below is the whole closure), so
the same commit and policy give the same bytes, and the asset hash changes only when
the code, the policy or a pin does. Wheels are downloaded once for
``manylinux2014_x86_64`` / CPython 3.11 into a cache (``TRAINGUARD_WHEEL_CACHE``, default
``.tools/wheels``); later builds are offline.

``python -m stacks.package POLICY [OUT.zip]`` builds one and prints its size.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAMBDA_LIMIT_BYTES = 50 * 1024 * 1024  # direct-upload limit of a zipped Lambda package
POLICY_NAME = "policy.yaml"  # where the environment's policy lands in the package
HANDLER = "lambdas.aws.handler"

#: the whole wheel closure of the Lambda beyond boto3 (exact pins: reproducible builds)
WHEELS = (
    "numpy==2.2.6",
    "pyyaml==6.0.4",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
    "aws-lambda-powertools==3.37.0",
    "jmespath==1.1.0",
)
PLATFORM = ("--platform", "manylinux2014_x86_64", "--only-binary=:all:",
            "--python-version", "3.11", "--implementation", "cp")

#: the repository's code in the package: folders whole, single files, and data
CODE = ("checker", "adapters", "lambdas", "trainguard/__init__.py", "trainguard/policy.py",
        "trainguard/data")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_SKIP_PARTS = {"__pycache__", "tests"}  # bytecode and the wheels' own test suites


@dataclass(frozen=True)
class Package:
    path: Path
    size: int  # bytes, zipped
    files: int


def wheel_cache() -> Path:
    return Path(os.environ.get("TRAINGUARD_WHEEL_CACHE", ROOT / ".tools" / "wheels"))


def _wheel_present(cache: Path, pin: str) -> bool:
    name, version = pin.split("==")
    stem = name.replace("-", "_").lower()
    return any(p.name.lower().startswith(f"{stem}-{version}-") for p in cache.glob("*.whl"))


def fetch_wheels(cache: Path | None = None) -> list[Path]:
    """The pinned wheels, downloaded into the cache when missing."""
    cache = cache or wheel_cache()
    cache.mkdir(parents=True, exist_ok=True)
    missing = [w for w in WHEELS if not _wheel_present(cache, w)]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--dest", str(cache), *PLATFORM, *missing]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"cannot download the Lambda's wheels into {cache} "
                               f"({', '.join(missing)}): {done.stderr.strip()[-500:]}")
    wheels = []
    for pin in WHEELS:
        name, version = pin.split("==")
        stem = name.replace("-", "_").lower()
        found = sorted(p for p in cache.glob("*.whl")
                       if p.name.lower().startswith(f"{stem}-{version}-"))
        if not found:
            raise RuntimeError(f"wheel {pin} missing from {cache} after download")
        wheels.append(found[0])
    return wheels


def _code_files(root: Path) -> Iterator[tuple[str, Path]]:
    for item in CODE:
        path = root / item
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(root)
            if _SKIP_PARTS.isdisjoint(rel.parts) and f.suffix not in (".pyc", ".pyo"):
                yield rel.as_posix(), f


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # unix: the mode above is read as a unix mode everywhere
    return info


def build(policy: Path, out: Path, root: Path = ROOT, cache: Path | None = None) -> Package:
    """Write the package for ``policy`` to ``out``; same inputs, same bytes."""
    entries: dict[str, bytes] = {}
    for name, path in _code_files(root):
        entries[name] = path.read_bytes()
    entries[POLICY_NAME] = policy.read_bytes()
    for wheel in fetch_wheels(cache):
        with zipfile.ZipFile(wheel) as whl:
            for info in whl.infolist():
                parts = info.filename.split("/")
                if info.is_dir() or not _SKIP_PARTS.isdisjoint(parts[:-1]) \
                        or info.filename.endswith(".pyc"):
                    continue
                if info.filename in entries:
                    raise RuntimeError(f"{wheel.name}: {info.filename} is also in the code")
                entries[info.filename] = whl.read(info)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        for name in sorted(entries):
            zf.writestr(_entry(name), entries[name], compresslevel=6)
    tmp.replace(out)
    size = out.stat().st_size
    if size > LAMBDA_LIMIT_BYTES:
        raise RuntimeError(f"{out}: the Lambda package is {size / 2**20:.1f} MiB, over the "
                           f"{LAMBDA_LIMIT_BYTES / 2**20:.0f} MiB limit of a zipped upload")
    return Package(path=out, size=size, files=len(entries))


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print("usage: python -m stacks.package POLICY.yaml [OUT.zip]", file=sys.stderr)
        return 2
    out = Path(argv[1]) if len(argv) > 1 else ROOT / "build" / "lambda.zip"
    pkg = build(Path(argv[0]), out)
    print(f"{pkg.path}: {pkg.size:,} bytes ({pkg.size / 2**20:.1f} MiB), {pkg.files} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
