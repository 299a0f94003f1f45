"""Reproducible zips of the watchdog: the AWS Lambda package (``LAMBDA``) and the Azure
Function App package (``FUNCTION``). Both hold the repository's code, one environment's
policy and the pinned wheels their runtime needs; they differ in where the wheels go,
which extra files lie at the root and the size limit (``Package`` below).

Reproducible: entries are sorted, every timestamp is 1980-01-01, every mode 0644, and
the wheels are pinned exactly (``--no-deps``: each list is its whole closure), so the
same commit and policy give the same bytes, and the asset hash changes only when the
code, the policy or a pin does. Wheels are downloaded once for ``manylinux2014_x86_64``
/ CPython 3.11 into a cache (``TRAINGUARD_WHEEL_CACHE``, default ``.tools/wheels``);
later builds are offline.

``python -m trainguard.stacks.package [lambda|function] POLICY [OUT.zip]`` builds one and prints
its size.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAMBDA_LIMIT_BYTES = 50 * 1024 * 1024  # direct-upload limit of a zipped Lambda package
POLICY_NAME = "policy.yaml"  # where the environment's policy lands in either package
HANDLER = "trainguard.lambdas.aws.handler"  # the Lambda's handler: the module's ``handler``
PLATFORM = ("--platform", "manylinux2014_x86_64", "--only-binary=:all:",
            "--python-version", "3.11", "--implementation", "cp")

#: the repository's code in both packages: the runtimes and the layers under them, whole
#: (config holds the policy loader and the default policy), and the package's __init__
CODE = ("checker", "adapters", "config", "lambdas", "trainguard/__init__.py")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_SKIP_PARTS = {"__pycache__", "tests"}  # bytecode and the wheels' own test suites


@dataclass(frozen=True)
class Built:
    path: Path
    size: int  # bytes, zipped
    files: int


def wheel_cache() -> Path:
    return Path(os.environ.get("TRAINGUARD_WHEEL_CACHE", ROOT / ".tools" / "wheels"))


#: the SHA-256 of every wheel the packages ship, in ``sha256sum`` format (``cd CACHE &&
#: sha256sum -c stacks/wheels.sha256`` checks a cache by hand). A wheel is downloaded
#: with ``--require-hashes`` and checked again before it is packed: a wheel whose bytes
#: differ, or a pin with no recorded hash, fails the build (issue 16).
LOCK = ROOT / "stacks" / "wheels.sha256"


def load_lock(path: Path = LOCK) -> dict[str, str]:
    """wheel file name -> its SHA-256, from ``path``."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name.endswith(".whl"):
            raise RuntimeError(f"{path}:{n}: expected 'SHA256  NAME.whl', got {line!r}")
        out[name] = digest
    return out


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


#: the container image's whole dependency closure, hash-locked (Containerfile)
CONTAINER_LOCK = ROOT / "requirements" / "container.txt"


def unpinned(requirements: Path) -> list[str]:
    """``FILE:LINE: reason`` for every requirement of a pip requirements file that is not
    an exact ``name==version`` with at least one ``--hash=sha256:`` (what
    ``pip install --require-hashes`` needs of every line)."""
    problems: list[str] = []
    logical: list[tuple[int, str]] = []
    start, text = 0, ""
    for n, raw in enumerate(requirements.read_text().splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not text:
            start = n
        text += " " + line.rstrip("\\").strip() if line else ""
        if not line.endswith("\\") and text.strip():
            logical.append((start, text.strip()))
            text = ""
    for n, req in logical:
        name, *rest = req.split()
        if name.startswith("-"):
            problems.append(f"{requirements}:{n}: option {name!r} (only pinned requirements)")
        elif "==" not in name or any(c in name for c in "<>~*,"):
            problems.append(f"{requirements}:{n}: {name!r} is not pinned to one version")
        elif not any(r.startswith("--hash=sha256:") for r in rest):
            problems.append(f"{requirements}:{n}: {name!r} has no --hash=sha256:")
    return problems


def _stem(pin: str) -> tuple[str, str]:
    name, version = pin.split("==")
    return name.replace("-", "_").lower(), version


def _is(name: str, pin: str) -> bool:
    stem, version = _stem(pin)
    return name.lower().startswith(f"{stem}-{version}-")


def _matches(cache: Path, pin: str) -> list[Path]:
    return sorted(p for p in cache.glob("*.whl") if _is(p.name, pin))


def _code_files(root: Path) -> Iterator[tuple[str, Path]]:
    for item in CODE:
        path = root / item
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(root)
            if _SKIP_PARTS.isdisjoint(rel.parts) and f.suffix not in (".pyc", ".pyo"):
                # the layers' folders sit beside trainguard/ in the repository and inside it
                # once installed (one import namespace, issue 14)
                name = rel.as_posix()
                yield (name if rel.parts[0] == "trainguard" else f"trainguard/{name}"), f


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # unix: the mode above is read as a unix mode everywhere
    return info


class Package:
    """One kind of package. A subclass says what differs: its wheels, the folder they
    are unpacked into, the files laid at the zip's root and the size limit."""

    kind = ""  # a word for messages and the command line
    wheels: tuple[str, ...] = ()  # exact pins, the whole closure
    site: str = ""  # where wheels are unpacked inside the zip ("" = the root)
    limit_bytes: int | None = None  # refuse a bigger zip
    root_files: tuple[tuple[str, str], ...] = ()  # (name in the zip, repository path)

    def fetch_wheels(self, cache: Path | None = None,
                     lock_path: Path | None = None) -> list[Path]:
        """The pinned wheels, downloaded into the cache when missing, each checked
        against its recorded SHA-256."""
        cache = cache or wheel_cache()
        cache.mkdir(parents=True, exist_ok=True)
        with _locked(cache / ".lock"):  # one download at a time into a shared cache
            return self._fetch_wheels(cache, lock_path)

    def _fetch_wheels(self, cache: Path, lock_path: Path | None) -> list[Path]:
        lock = load_lock(lock_path or LOCK)
        hashes = {pin: sorted(h for name, h in lock.items() if _is(name, pin))
                  for pin in self.wheels}
        unpinned = [pin for pin, found in hashes.items() if not found]
        if unpinned:
            raise RuntimeError(f"unpinned input: no SHA-256 recorded for {', '.join(unpinned)} "
                               f"in {lock_path or LOCK}")
        missing = [w for w in self.wheels if not _matches(cache, w)]
        if missing:
            requirements = cache / ".requirements.txt"
            requirements.write_text("".join(
                f"{pin} " + " ".join(f"--hash=sha256:{h}" for h in hashes[pin]) + "\n"
                for pin in missing))
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                   "--require-hashes", "--dest", str(cache), *PLATFORM,
                   "-r", str(requirements)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"cannot download the {self.kind} package's wheels into "
                                   f"{cache} ({', '.join(missing)}): "
                                   f"{done.stderr.strip()[-500:]}")
        wheels = []
        for pin in self.wheels:
            found = _matches(cache, pin)
            if not found:
                raise RuntimeError(f"wheel {pin} missing from {cache} after download")
            digest = sha256_of(found[0])
            if lock.get(found[0].name) != digest:
                raise RuntimeError(f"{found[0]}: SHA-256 {digest} is not the one recorded in "
                                   f"{lock_path or LOCK} ({lock.get(found[0].name)}): "
                                   "refusing to pack it")
            wheels.append(found[0])
        return wheels

    def entries(self, policy: Path, root: Path, cache: Path | None) -> dict[str, bytes]:
        entries = {name: path.read_bytes() for name, path in _code_files(root)}
        for name, rel in self.root_files:
            entries[name] = (root / rel).read_bytes()
        entries[POLICY_NAME] = policy.read_bytes()
        prefix = f"{self.site}/" if self.site else ""
        for wheel in self.fetch_wheels(cache):
            with zipfile.ZipFile(wheel) as whl:
                for info in whl.infolist():
                    parts = info.filename.split("/")
                    if info.is_dir() or not _SKIP_PARTS.isdisjoint(parts[:-1]) \
                            or info.filename.endswith(".pyc"):
                        continue
                    name, data = prefix + info.filename, whl.read(info)
                    if name in entries and entries[name] != data:
                        raise RuntimeError(f"{wheel.name}: {name} is also in the code or "
                                           "another wheel, with other bytes")
                    entries[name] = data
        return entries

    def build(self, policy: Path, out: Path, root: Path = ROOT,
              cache: Path | None = None) -> Built:
        """Write the package for ``policy`` to ``out``; same inputs, same bytes."""
        entries = self.entries(policy, root, cache)
        out.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own: two synths of one checkout at once (the test suite's workers)
        # each write their whole zip, then one atomic replace each, of the same bytes
        fd, name = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            with zipfile.ZipFile(tmp, "w") as zf:
                for entry in sorted(entries):
                    zf.writestr(_entry(entry), entries[entry], compresslevel=6)
            tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
        size = out.stat().st_size
        if self.limit_bytes is not None and size > self.limit_bytes:
            raise RuntimeError(f"{out}: the {self.kind} package is {size / 2**20:.1f} MiB, "
                               f"over its {self.limit_bytes / 2**20:.0f} MiB limit")
        return Built(path=out, size=size, files=len(entries))


#: What every runtime's checker, adapters and policy loader need (exact pins: the
#: packages are reproducible).
CORE_WHEELS = (
    "numpy==2.2.6",
    "pyyaml==6.0.4",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
)


class LambdaPackage(Package):
    """The AWS Lambda: wheels at the root beside the code (Lambda puts the zip's root on
    ``sys.path``); boto3 comes with the runtime."""

    kind = "Lambda"
    wheels = (
        *CORE_WHEELS,
        "aws-lambda-powertools==3.37.0",
        "jmespath==1.1.0",
    )
    limit_bytes = LAMBDA_LIMIT_BYTES


#: where the Functions host looks for a Python app's dependencies
FUNCTION_SITE = ".python_packages/lib/site-packages"
FUNCTION_ENTRY = "function_app.py"  # the v2 programming model's entry file, at the root


class FunctionPackage(Package):
    """The Azure Function App: ``function_app.py`` and ``host.json`` at the root, wheels
    under ``.python_packages/lib/site-packages`` (no remote build: the zip is complete).
    The closure is that of numpy, pydantic, pyyaml, azure-ai-ml, azure-identity,
    azure-functions and azure-data-tables (``pip download`` resolved it once)."""

    kind = "Function App"
    site = FUNCTION_SITE
    root_files = ((FUNCTION_ENTRY, "lambdas/azure/function_app.py"),
                  ("host.json", "lambdas/azure/host.json"))
    wheels = (
        *CORE_WHEELS,
        "azure-ai-ml==1.35.2",
        "azure-identity==1.27.0",
        "azure-functions==1.26.0",
        "azure-data-tables==12.7.0",
        "azure-core==1.41.0",
        "azure-core-tracing-opentelemetry==1.0.0b13",
        "azure-mgmt-core==1.6.0",
        "azure-monitor-opentelemetry==1.8.11",
        "azure-monitor-opentelemetry-exporter==1.0.0b58",
        "azure-storage-blob==12.31.1",
        "azure-storage-file-datalake==12.26.1",
        "azure-storage-file-share==12.27.1",
        "asgiref==3.13.0",
        "attrs==26.1.0",
        "certifi==2026.10.19.post1",
        "cffi==2.1.1",
        "charset-normalizer==3.5.3",
        "colorama==0.4.6",
        "cryptography==50.0.2",
        "idna==3.20",
        "isodate==0.7.2",
        "jsonschema==4.26.0",
        "jsonschema-specifications==2025.9.1",
        "markupsafe==3.0.4",
        "marshmallow==3.26.2",
        "msal==1.39.0",
        "msal-extensions==1.3.1",
        "msrest==0.7.1",
        "multidict==7.2.1",
        "oauthlib==4.0.1",
        "opentelemetry-api==1.45.1",
        "opentelemetry-instrumentation==0.66b1",
        "opentelemetry-instrumentation-asgi==0.66b1",
        "opentelemetry-instrumentation-dbapi==0.66b1",
        "opentelemetry-instrumentation-django==0.66b1",
        "opentelemetry-instrumentation-fastapi==0.66b1",
        "opentelemetry-instrumentation-flask==0.66b1",
        "opentelemetry-instrumentation-httpx==0.66b1",
        "opentelemetry-instrumentation-logging==0.66b1",
        "opentelemetry-instrumentation-psycopg2==0.66b1",
        "opentelemetry-instrumentation-requests==0.66b1",
        "opentelemetry-instrumentation-urllib==0.66b1",
        "opentelemetry-instrumentation-urllib3==0.66b1",
        "opentelemetry-instrumentation-wsgi==0.66b1",
        "opentelemetry-resource-detector-azure==0.3.0",
        "opentelemetry-sdk==1.45.1",
        "opentelemetry-semantic-conventions==0.66b1",
        "opentelemetry-util-http==0.66b1",
        "packaging==26.4",
        "propcache==0.5.4",
        "psutil==7.2.2",
        "pycparser==3.12",
        "pydash==8.1.0",
        "pyjwt==2.15.1",
        "python-dateutil==4.0.0",
        "referencing==0.37.0",
        "requests==2.34.2",
        "requests-oauthlib==2.0.0",
        "rpds-py==2026.9.1",
        "strictyaml==1.7.3",
        "tqdm==4.70.1",
        "tzdata==2026.6",
        "urllib3==2.8.0",
        "werkzeug==3.1.9",
        "wrapt==2.5.2",
        "yarl==1.25.1",
    )


LAMBDA = LambdaPackage()
FUNCTION = FunctionPackage()
KINDS: dict[str, Package] = {"lambda": LAMBDA, "function": FUNCTION}


def build(policy: Path, out: Path, root: Path = ROOT, cache: Path | None = None) -> Built:
    """The Lambda package (the name the AWS stack and its tests use)."""
    return LAMBDA.build(policy, out, root, cache)


def main(argv: list[str]) -> int:
    kind = argv[0] if argv and argv[0] in KINDS else "lambda"
    args = argv[1:] if argv and argv[0] in KINDS else argv
    if not 1 <= len(args) <= 2:
        print("usage: python -m trainguard.stacks.package [lambda|function] POLICY.yaml [OUT.zip]",
              file=sys.stderr)
        return 2
    out = Path(args[1]) if len(args) > 1 else ROOT / "build" / f"{kind}.zip"
    pkg = KINDS[kind].build(Path(args[0]), out)
    print(f"{pkg.path}: {pkg.size:,} bytes ({pkg.size / 2**20:.1f} MiB), {pkg.files} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` while the block runs (POSIX ``flock``; where there is
    none, no lock)."""
    try:
        import fcntl
    except ImportError:  # Windows: one synth at a time is the user's to keep
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
