"""The registries (``checker/registry.py``): rules, sources, stores and sinks are found by
walking their package, never listed by hand; a plug-in whose third-party package is not
installed is named with the reason when asked for, and a broken import of our own fails
loudly."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import trainguard.checker.rules
from trainguard.checker.registry import RULES, Registry, UnknownName, rule_names
from trainguard.checker.rules.base import Rule

ROOT = Path(__file__).resolve().parent.parent


def test_every_rule_module_is_found_without_a_list() -> None:
    """Each rule defined in a module of checker/rules (a new one included) is registered;
    a module of a rule's parts (``divergence_state``) defines none."""
    names = set(rule_names())
    registered = set(RULES.values())
    modules = 0
    for info in pkgutil.iter_modules(trainguard.checker.rules.__path__):
        module = importlib.import_module(f"trainguard.checker.rules.{info.name}")
        defined = [c for c in vars(module).values()
                   if isinstance(c, type) and issubclass(c, Rule)
                   and c.__module__ == module.__name__ and not inspect.isabstract(c)]
        assert all(c in registered for c in defined), f"{module.__name__}: a rule not registered"
        modules += bool(defined)
    assert modules == len(names) and {"stall", "plateau", "divergence", "budget"} <= names


def _package(tmp_path: Path, name: str, modules: dict[str, str]) -> str:
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    for module, text in modules.items():
        (root / f"{module}.py").write_text(text)
    return name


@pytest.fixture
def plug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry[type]]:
    """A package of three plug-in modules written in the test: two register a class
    each, one needs a package that is not installed."""
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry[type] = Registry("widget", "tgplugtest")
    monkeypatch.setattr(sys.modules[__name__], "WIDGETS", registry, raising=False)
    use = "from tests.test_registry import WIDGETS\n"
    _package(tmp_path, "tgplugtest", {
        "blue": use + "@WIDGETS.register('blue')\nclass Blue: pass\n",
        "red": use + "@WIDGETS.register('red')\nclass Red: pass\n",
        "cloudy": "import not_installed_sdk_xyz\n" + use +
                  "@WIDGETS.register('cloudy')\nclass Cloudy: pass\n",
    })
    yield registry
    for name in [m for m in sys.modules if m.startswith("tgplugtest")]:
        del sys.modules[name]


def test_plug_ins_are_found_and_a_missing_sdk_is_named(plug: Registry[type]) -> None:
    assert plug.get("red").__name__ == "Red"  # found on the first lookup
    assert plug.names() == ["blue", "red"]
    with pytest.raises(UnknownName) as e:
        plug.get("cloudy")
    assert "unknown widget 'cloudy' (known: blue, red" in str(e.value)
    assert "tgplugtest.cloudy (needs 'not_installed_sdk_xyz', not installed here)" in str(e.value)


def test_a_name_registered_twice_is_an_error() -> None:
    reg: Registry[type] = Registry("widget", "trainguard.checker.rules")

    class A:
        pass

    class B:
        pass

    reg.add("a", A)
    reg.add("a", A)  # the same class again (a module imported twice): fine
    with pytest.raises(ValueError, match="widget 'a' is registered twice"):
        reg.add("a", B)


def test_a_broken_import_of_our_own_fails_loudly(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    _package(tmp_path, "tgplugbroken", {"bad": "import trainguard.no_such_module\n"})
    with pytest.raises(ModuleNotFoundError, match=r"trainguard\.no_such_module"):
        Registry("widget", "tgplugbroken").load()


def test_the_sources_are_the_provider_packages() -> None:
    from trainguard.adapters.sources import build, sources

    assert sources.names() == ["azureml", "kubeflow", "prometheus", "sagemaker"]
    with pytest.raises(ValueError, match=r"unknown source 'nope' \(known: azureml, kubeflow"):
        build("nope", {})


def test_building_one_source_imports_no_other_providers_sdk() -> None:
    probe = ("import sys\n"
             "from trainguard.adapters.sources import build\n"
             "build('prometheus', {'url': 'http://127.0.0.1:9'})\n"
             "print(sorted(m for m in ('boto3', 'azure.core', 'kubernetes') "
             "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_the_stores_and_sinks_the_runtimes_pick() -> None:
    from trainguard.lambdas.plugins import sinks, stores
    from trainguard.lambdas.sqlite_state import SQLiteStore

    assert stores.names() == ["configmap", "dynamodb", "memory", "sqlite", "table"]
    assert stores.get("sqlite") is SQLiteStore
    assert {"sns", "cloudwatch", "webhook", "azure_metrics", "alertmanager",
            "pushgateway"} <= set(sinks.names())
    with pytest.raises(UnknownName, match=r"unknown state store 'etcd' \(known: configmap"):
        stores.get("etcd")


def test_a_registered_plug_in_without_a_contract_case_fails_the_suite(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.contract import Cases
    from trainguard.lambdas import plugins

    widgets: Registry[type] = Registry("state store", "trainguard.lambdas", lambda m: False)
    widgets.add("etcd", object)
    widgets.add("sqlite", object)
    monkeypatch.setattr(plugins, "widgets", widgets, raising=False)
    cases: Cases[Callable[[], str]] = Cases("state store", "tests/contract/stores.py",
                                           "widgets")
    cases.register("sqlite")(lambda: "a case")
    assert cases.names() == ["etcd", "sqlite"]  # the registry's names, not the cases'
    assert cases.factory("sqlite")() == "a case"
    with pytest.raises(pytest.fail.Exception, match=r"state store 'etcd' is registered but "
                       r"has no contract case: add a factory with @store\('etcd'\)"):
        cases.factory("etcd")
