"""Run ids that tell runs apart: the nearest path parts that distinguish them.

``lightning_logs/version_0`` beside ``lightning_logs/version_1`` are ``version_0`` and
``version_1``; ``a/lightning_logs/version_0`` beside ``b/lightning_logs/version_0`` are
``a/version_0`` and ``b/version_0`` (the shared ``lightning_logs`` says nothing), and a
``a/lightning_logs/version_1`` beside them is ``a/version_1``: the runs of one folder
are named alike. File names
every run of a framework shares (``metrics.csv``, ``trainer_state.json``, an event file)
are not ids: their folder is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

#: file names that name the framework, not the run: the run is the folder holding them
GENERIC_FILES = frozenset({"metrics.csv", "trainer_state.json", "hparams.yaml", "mlflow.db",
                           "meta.yaml"})


def run_parts(path: str | Path) -> list[str]:
    """The parts of a run's path that may name it, nearest last; a generic file name
    (and an event file's) is dropped, and so is a file's extension (not a folder's:
    ``lr0.1`` stays whole)."""
    parts = [x for x in Path(os.path.abspath(path)).parts if x not in ("/", "")]
    if parts and (parts[-1] in GENERIC_FILES or (parts[-1].endswith(".gz") and
                  parts[-1][:-3] in GENERIC_FILES)
                  or parts[-1].startswith("events.out.tfevents.")):
        parts = parts[:-1]
    if parts and "." in parts[-1].lstrip(".") and not Path(path).is_dir():
        parts[-1] = parts[-1].split(".")[0] or parts[-1]
    return parts or [str(path)]


def distinguishing_ids(names: Sequence[Sequence[str]]) -> list[str]:
    """One id per run from its parts (outermost first, the run's own name last): the
    last part, with the nearest parts that tell it from the runs it would clash with."""
    chosen: list[list[int]] = [[len(n) - 1] for n in names]  # indices of the parts kept

    def label(i: int) -> str:
        return "/".join(names[i][j] for j in sorted(chosen[i]))

    for _ in range(max((len(n) for n in names), default=0)):
        ids = [label(i) for i in range(len(names))]
        clashes: dict[str, list[int]] = {}
        for i, id_ in enumerate(ids):
            clashes.setdefault(id_, []).append(i)
        groups = [g for g in clashes.values() if len(g) > 1]
        if not groups:
            break
        for group in groups:
            # the nearest level (counted from the end) at which the group's paths differ,
            # given to the group and to the runs beside them (same folder), so that
            # version_1 beside expA/version_0 reads expA/version_1
            depth = min(len(names[i]) for i in group)
            for back in range(2, depth + 1):
                if len({names[i][-back] for i in group}) > 1:
                    folders = {tuple(names[i][:-1]) for i in group}
                    for i, n in enumerate(names):
                        j = len(n) - back
                        if tuple(n[:-1]) in folders and j >= 0 and j not in chosen[i]:
                            chosen[i].append(j)
                    break
            else:  # one path is a suffix of another: whole paths
                for i in group:
                    chosen[i] = list(range(len(names[i])))
    ids = [label(i) for i in range(len(names))]
    # what is still the same (the same path given twice) is numbered
    seen: dict[str, int] = {}
    out = []
    for id_ in ids:
        count = seen.get(id_, 0) + 1
        seen[id_] = count
        out.append(id_ if ids.count(id_) == 1 else f"{id_}#{count}")
    return out


def path_ids(paths: Sequence[str | Path]) -> list[str]:
    """Ids for run paths (``distinguishing_ids`` of their ``run_parts``)."""
    return distinguishing_ids([run_parts(p) for p in paths])
