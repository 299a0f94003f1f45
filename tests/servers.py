"""Real servers from Debian packages, started by the tests on loopback.

``start_server`` runs one binary on a free loopback port until its readiness URL
answers, and stops it afterwards; each server (Prometheus now, Alertmanager and
Pushgateway later) is a small function giving it its arguments. ``shared`` keeps one
server per key for the whole test session, so a fixture and a contract case can share
it. A server whose binary is absent skips the test with the package to install.

To use the fixtures in a test module, import them (``from tests.servers import
prometheus_bin``) or list ``tests.servers`` in conftest's ``pytest_plugins``.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

# binary -> the Debian package that installs it
PACKAGES = {"prometheus": "prometheus", "promtool": "prometheus",
            "prometheus-alertmanager": "prometheus-alertmanager",
            "prometheus-pushgateway": "prometheus-pushgateway"}


@dataclass
class Server:
    name: str
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[bytes]
    workdir: Path  # the server's own files (data, logs), removed when it stops
    info: dict[str, Any]  # what the starter wants its users to know (e.g. the data's "now")

    def log(self) -> str:
        path = self.workdir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


def binary(name: str) -> str:
    """The path of ``name``, or a skip saying which package to install."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file()
                                   else None)
    if found is None:
        pytest.skip(f"{name} is not installed (apt-get install {PACKAGES.get(name, name)})")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def start_server(name: str, argv: Callable[[int, Path], list[str]], ready_path: str,
                 workdir: Path | None = None, timeout: float = 30.0,
                 info: dict[str, Any] | None = None) -> Iterator[Server]:
    """Run ``argv(port, workdir)`` until ``GET ready_path`` answers 200, then yield it."""
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix=f"tg-{name}-")) if workdir is None else workdir
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (work / "server.log").open("wb") as out:
        process = subprocess.Popen(argv(port, work), stdout=out, stderr=subprocess.STDOUT)
    server = Server(name, url, process, work, dict(info or {}))
    try:
        _wait_ready(server, url + ready_path, timeout)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if own:
            shutil.rmtree(work, ignore_errors=True)


def _wait_ready(server: Server, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}:\n"
                               f"{server.log()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} not ready at {url} after {timeout}s:\n"
                       f"{server.log()[-3000:]}")


# One server per key for the session, stopped when pytest finishes.
_SHARED: dict[str, Server] = {}


def shared(config: pytest.Config, key: str,
           start: Callable[[], contextlib.AbstractContextManager[Server]]) -> Server:
    if key not in _SHARED:
        stack = contextlib.ExitStack()
        _SHARED[key] = stack.enter_context(start())

        def stop() -> None:
            _SHARED.pop(key, None)
            stack.close()

        config.add_cleanup(stop)
    return _SHARED[key]


# --- Prometheus -------------------------------------------------------------------

#: One series to load: metric name, labels, times (epoch seconds), values.
Samples = tuple[str, dict[str, str], npt.ArrayLike, npt.ArrayLike]


def openmetrics(series: Iterable[Samples]) -> str:
    """OpenMetrics text exposition of ``series``, each metric family's lines together."""
    families: dict[str, list[str]] = {}
    for name, labels, times, values in series:
        tags = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        lines = families.setdefault(name, [f"# TYPE {name} gauge"])
        pairs = zip(np.asarray(times, dtype=float), np.asarray(values, dtype=float), strict=True)
        lines += [f"{name}{{{tags}}} {_number(float(v))} {t:.3f}" for t, v in pairs]
    return "\n".join(line for lines in families.values() for line in lines) + "\n# EOF\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))  # shortest text that reads back as the same float


def openmetrics_blocks(text: str, tsdb: Path) -> None:
    """Write OpenMetrics ``text`` (ending in ``# EOF``) into TSDB blocks under ``tsdb``
    with ``promtool tsdb create-blocks-from openmetrics``."""
    promtool = binary("promtool")
    tsdb.mkdir(parents=True, exist_ok=True)
    source = tsdb.parent / "input.om"
    source.write_text(text)
    # Blocks of up to a day keep a long run in few blocks (the default cuts at 2 h).
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics",
                           "--max-block-duration=24h", str(source), str(tsdb)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"promtool could not create blocks: {done.stderr[-3000:]}")


@contextlib.contextmanager
def prometheus(openmetrics: str | None = None,
               info: dict[str, Any] | None = None) -> Iterator[Server]:
    """A Prometheus on a free loopback port over a temporary TSDB, loaded with
    ``openmetrics`` (samples must be within the default 15 days of retention)."""
    exe = binary("prometheus")
    work = Path(tempfile.mkdtemp(prefix="tg-prometheus-"))
    try:
        if openmetrics is not None:
            openmetrics_blocks(openmetrics, work / "data")
        (work / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\n")

        def argv(port: int, wd: Path) -> list[str]:
            return [exe, f"--config.file={wd / 'prometheus.yml'}",
                    f"--storage.tsdb.path={wd / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]

        with start_server("prometheus", argv, "/-/ready", workdir=work, info=info) as server:
            yield server
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    """The prometheus binary (with promtool beside it), or a skip naming the package."""
    binary("promtool")
    return binary("prometheus")


# --- Azurite (Azure Table Storage) ------------------------------------------------

#: Azurite's well-known development account (public, documented, the same everywhere).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
AZURITE_TABLE = Path(__file__).resolve().parents[1] / ".tools/node_modules/.bin/azurite-table"


def azurite_connection(server: Server) -> str:
    """The connection string of the development account on ``server``."""
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};TableEndpoint={server.url}/{AZURITE_ACCOUNT};")


@contextlib.contextmanager
def azurite_table() -> Iterator[Server]:
    """Azurite's Table service on a free loopback port, data in a temporary folder.
    Skips when node or the npm package is absent."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed (Azurite needs Node.js: apt-get install nodejs)")
    if not AZURITE_TABLE.exists():
        pytest.skip(f"Azurite is not installed ({AZURITE_TABLE} is missing: "
                    "npm install --prefix .tools azurite@3)")
    from azure.core.credentials import AzureNamedKeyCredential
    from azure.data.tables import AccountSasPermissions, ResourceTypes, generate_account_sas

    # Azurite answers nothing anonymously: readiness is a signed table listing (in JSON:
    # it refuses the Atom format a bare GET would ask for).
    sas = generate_account_sas(
        AzureNamedKeyCredential(AZURITE_ACCOUNT, AZURITE_KEY),
        resource_types=ResourceTypes(service=True, container=True, object=True),
        permission=AccountSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))

    def argv(port: int, wd: Path) -> list[str]:
        return [str(AZURITE_TABLE), "--tableHost", "127.0.0.1", "--tablePort", str(port),
                "--location", str(wd), "--skipApiVersionCheck", "--disableTelemetry",
                "--silent"]

    with start_server("azurite-table", argv, f"/{AZURITE_ACCOUNT}/Tables?{sas}"
                      "&$format=application%2Fjson%3Bodata%3Dnometadata") as server:
        yield server


@pytest.fixture(scope="session")
def azurite(pytestconfig: pytest.Config) -> Server:
    """One Azurite Table service for the session (each test uses its own table)."""
    return shared(pytestconfig, "azurite-table", azurite_table)


# --- Alertmanager and Pushgateway -----------------------------------------------------


@contextlib.contextmanager
def alertmanager(config: str) -> Iterator[Server]:
    """An Alertmanager on a free loopback port with the YAML ``config`` (its receivers,
    e.g. a webhook on loopback), clustering off, its storage in a temporary folder."""
    exe = binary("prometheus-alertmanager")

    def argv(port: int, wd: Path) -> list[str]:
        (wd / "alertmanager.yml").write_text(config)
        return [exe, f"--config.file={wd / 'alertmanager.yml'}", f"--storage.path={wd / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                "--log.level=warn"]

    with start_server("alertmanager", argv, "/-/ready") as server:
        yield server


@contextlib.contextmanager
def pushgateway() -> Iterator[Server]:
    """A Pushgateway on a free loopback port, keeping what it is pushed in memory."""
    exe = binary("prometheus-pushgateway")

    def argv(port: int, wd: Path) -> list[str]:
        # Debian's build persists to /var/lib/prometheus/pushgateway.data by default:
        # every test's gateway would start with what the others pushed.
        return [exe, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
                f"--persistence.file={wd / 'pushgateway.data'}"]

    with start_server("pushgateway", argv, "/-/ready") as server:
        yield server
