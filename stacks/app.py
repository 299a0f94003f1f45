"""The cdktn app: one stack per environment file, built by its cloud's stack class."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cdktn import App

from trainguard.stacks.environment import ENVIRONMENTS, ROOT, Environment, load_all

#: cloud -> "module:Class"; imported only when an environment needs it (each provider
#: package loads hundreds of MB of jsii bindings)
STACKS = {
    "aws": "trainguard.stacks.aws:AwsStack",
    "azure": "trainguard.stacks.azure:AzureStack",
    "openshift": "trainguard.stacks.openshift:OpenshiftStack",
}
BUILD = ROOT / "build" / "stacks"  # Lambda packages (the stacks copy them as assets)


def stack_class(cloud: str) -> Any:
    module, name = STACKS[cloud].split(":")
    return getattr(importlib.import_module(module), name)


def select(envs: list[Environment], names: Sequence[str]) -> list[Environment]:
    known = {e.name: e for e in envs}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(
            f"trainguard: error: no environment named {', '.join(unknown)} in "
            f"{ENVIRONMENTS.relative_to(ROOT)}/ (known: {', '.join(sorted(known))})")
    return [known[n] for n in names] if names else envs


def build_app(envs: list[Environment], outdir: Path | None = None,
              build_dir: Path = BUILD) -> App:
    app = App(outdir=str(outdir)) if outdir is not None else App()
    for env in envs:
        stack_class(env.cloud)(app, env, build_dir)
    return app


def synth(names: Sequence[str] = (), outdir: Path | None = None,
          folder: Path = ENVIRONMENTS) -> list[Environment]:
    envs = select(load_all(folder), names)
    build_app(envs, outdir).synth()
    return envs
