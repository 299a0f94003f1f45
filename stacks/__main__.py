"""``python -m trainguard.stacks [ENVIRONMENT...]``: synthesise one stack per environment file (all
of them by default) into ``cdktf.out/stacks/<environment>/cdk.tf.json``. This is the
``app`` of ``cdktf.json``, so ``cdktn synth`` and ``cdktn deploy <environment>`` run it.
Problems in the environment files are printed one a line, and the exit status is 2."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trainguard.stacks.environment import ENVIRONMENTS, EnvironmentFileError


def main(argv: list[str]) -> int:
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from trainguard.stacks.app import synth  # after the variable: jsii reads it on import

    try:
        # TRAINGUARD_ENVIRONMENTS: another folder of environment files (tests, forks)
        envs = synth(argv, folder=Path(os.environ.get("TRAINGUARD_ENVIRONMENTS",
                                                      ENVIRONMENTS)))
    except EnvironmentFileError as e:
        for problem in e.problems:
            print(f"trainguard: error: {problem}", file=sys.stderr)
        return 2
    print(f"synthesised {', '.join(e.name for e in envs)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
