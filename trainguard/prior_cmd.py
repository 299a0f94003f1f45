"""``trainguard prior learn``: a recipe prior for the ``target`` rule, from past runs.

A forecast of a run's final value from its first quarter is much better when it knows
how runs of the same recipe bend (warm-up, schedule, cool-down). This learns that shape
and the forecast's calibration from finished runs and prints it as a policy snippet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
import yaml

from trainguard.checker.forecast import learn_prior


def prior_learn(
    paths: Annotated[list[Path], typer.Argument(
        help="Finished runs of one recipe (files or folders of them).")],
    metric: Annotated[str, typer.Option(help="The metric with a target.")] = "val_loss",
    target: Annotated[float | None, typer.Option(
        help="The value that counts as success, written into the snippet.")] = None,
    planned: Annotated[int | None, typer.Option(
        help="Planned steps, for runs whose logs do not say (text logs with step:N/TOTAL do).")]
    = None,
    folds: Annotated[int, typer.Option(help="Folds for the out-of-fold calibration.")] = 5,
    group_by_folder: Annotated[bool, typer.Option(
        help="Keep runs of one folder (seeds of one configuration) in one fold.")] = True,
    out: Annotated[Path | None, typer.Option(help="Write the YAML here, not to stdout.")]
    = None,
) -> None:
    """Learn the curve shape and calibration of a recipe from its finished runs and print
    a policy snippet (rules.target.params) that the target rule reads."""
    from trainguard.adapters.local import load_run
    from trainguard.common import bad_input, fail, local_files

    curves, groups, skipped = [], [], []
    with bad_input():
        files = [f for p in paths for f in local_files(p)]
    for f in files:
        with bad_input():
            job = load_run(f)
        s = job.series.get(metric)
        steps = planned or job.planned_steps
        if s is None or not steps or not len(s) or not np.isfinite(s.value).all():
            skipped.append(f"{f}: no finite {metric!r} or no planned steps")
            continue
        curves.append((s.step, s.value, float(steps)))
        groups.append(str(f.parent) if group_by_folder else str(f))
    try:
        prior = learn_prior(curves, groups, folds=folds)
    except ValueError as e:
        fail(f"{e} ({len(curves)} usable of {len(files)} runs"
             + (f"; e.g. {skipped[0]}" if skipped else "") + ")")
    params: dict[str, object] = {"metric": metric, "prior": prior.to_dict()}
    if target is not None:
        params["target"] = target
    text = (f"# trainguard prior: learnt from {len(curves)} runs ({len(skipped)} skipped)\n"
            + yaml.safe_dump({"rules": {"target": {"params": params}}}, sort_keys=False,
                             default_flow_style=None, width=100))
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        typer.echo(f"wrote {out}: a prior from {len(curves)} runs", err=True)
