"""The command line as a CI log or a shell pipe sees it (a real pipe, no terminal, no
COLUMNS): every table row stays on one line; a run with nothing in it is ``no data``
with exit 2; ``--version``; an unknown ``--opt``; a policy naming a series no run has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

LONG = 200  # wider than any terminal default: a table cut to 80 columns cannot hold it


def trainguard(*args: object) -> subprocess.CompletedProcess[str]:
    """The real console script through a pipe, as `trainguard ... | tee log` runs it."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run([sys.executable, "-c", "from trainguard.cli import main; main()",
                           *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300, check=False)


def diverging_log(path: Path) -> Path:
    lines = [f'{{"time": {1_717_000_000 + 60 * i}, "step": {i}, '
             f'"validation/some_quite_long_metric_name_loss": {2.0 - 0.01 * i}, '
             f'"loss": {"NaN" if i >= 30 else 2.0 - 0.01 * i}}}' for i in range(40)]
    path.write_text("\n".join(lines) + "\n")
    return path


def one_line(text: str, *cells: str) -> bool:
    """Whether one line of ``text`` holds every cell whole."""
    return any(all(c in line for c in cells) for line in text.splitlines())


def test_check_and_replay_tables_keep_whole_rows_in_a_pipe(tmp_path: Path) -> None:
    run = diverging_log(tmp_path / "a-run-with-a-rather-long-name-to-fill-a-line.jsonl")
    doc = json.loads(trainguard("check", run, "--format", "json", "--price", "98.32").stdout)
    [finding] = [f for f in doc["runs"][0]["findings"] if f["rule"] == "divergence"]
    table = trainguard("check", run, "--price", "98.32")
    assert table.returncode == 1
    cells = ["critical", "divergence", finding["series"], finding["message"], finding["action"]]
    assert one_line(table.stdout, *cells), table.stdout
    assert len(max(table.stdout.splitlines(), key=len)) > 80  # not cut to 80 columns
    replayed = trainguard("replay", run)
    assert one_line(replayed.stdout, "divergence", finding["series"], finding["message"]), \
        replayed.stdout


def test_rules_table_keeps_whole_rows_in_a_pipe() -> None:
    from trainguard.checker.registry import RULES, rule_names

    out = trainguard("rules").stdout
    for name in rule_names():
        for param, default, meaning in RULES[name].describe():
            assert one_line(out, param, repr(default), meaning), (name, param)


def test_watch_summary_table_keeps_whole_rows_in_a_pipe(tmp_path: Path) -> None:
    run = tmp_path / "run.jsonl"
    script = tmp_path / "t.py"
    script.write_text("import sys; sys.exit(3)\n")
    done = trainguard("watch", run, "--start", f"{run}={sys.executable} {script}",
                      "--tick", "0.3", "--until", "30", "--state", tmp_path / "s.sqlite")
    assert done.returncode == 1
    assert one_line(done.stdout, "run", "FAILED", "3", "ok"), done.stdout


@pytest.mark.parametrize(("content", "reason"), [
    (b"", "the file is empty"),
    (b"\x00\x01\x02\x89PNG\x00" * 100, "a binary file"),
    (b"starting up\nall is well\nbye\n", "no metric or step recognised in 3 line(s)"),
])
def test_no_records_is_no_data_exit_2(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(content)
    done = trainguard("check", path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no data" in done.stdout and reason in done.stdout
    doc = json.loads(trainguard("check", path, "--format", "json").stdout)
    assert doc["runs"][0]["verdict"] == "no data" and reason in doc["runs"][0]["no_data"]
    assert trainguard("replay", path).returncode == 2


def test_version() -> None:
    from importlib.metadata import version

    done = trainguard("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"trainguard {version('trainguard')}"


def test_unknown_opt_is_an_error(tmp_path: Path) -> None:
    run = diverging_log(tmp_path / "run.jsonl")
    done = trainguard("check", run, "--opt", "regoin=us-east-1")
    assert done.returncode == 2 and "--opt 'regoin=us-east-1'" in done.stderr
    cloud = trainguard("check", "--source", "prometheus", "--opt", "urll=http://x")
    assert cloud.returncode == 2 and "urll" in cloud.stderr


def test_a_policy_naming_an_absent_series_is_warned_about(tmp_path: Path) -> None:
    run = diverging_log(tmp_path / "run.jsonl")
    policy = tmp_path / "p.yaml"
    policy.write_text("name: typo\nmetrics: {los: train_loss}\n"
                      "rules:\n  plateau:\n    params: {metric: val_los}\n")
    done = trainguard("check", run, "--policy", policy)
    assert "metrics.los names series 'train_loss', which no run has" in done.stderr
    assert "rules.plateau.params.metric names series 'val_los'" in done.stderr
    good = tmp_path / "good.yaml"
    good.write_text("name: fine\nmetrics: {objective: loss, reward: \"\"}\n")
    assert "warning" not in trainguard("check", run, "--policy", good).stderr  # "": none


def test_bench_tables_keep_whole_rows_in_a_pipe(tmp_path: Path, curves_dir: Path) -> None:
    """Six labelled genrisk runs (two diverged, two flat, two healthy), written as a
    labels file whose runs point where the corpus lies."""
    rows = (curves_dir / "labels.csv").read_text().splitlines()
    picked = [r for r in rows[1:] if r.startswith("genrisk/")][:6]
    labels = tmp_path / "labels.csv"
    labels.write_text("\n".join([rows[0]] + [str(curves_dir) + "/" + r for r in picked]) + "\n")
    done = trainguard("bench", labels)
    assert done.returncode == 0, done.stderr
    table_rows = [ln for ln in done.stdout.splitlines() if "│" in ln]
    assert table_rows and max(len(ln) for ln in done.stdout.splitlines()) > 80
    assert one_line(done.stdout, "divergence (diverged)", "trainguard divergence")
    # every row of every table has as many cells as its header: nothing folded
    for block in done.stdout.split("\n\n"):
        lines = block.splitlines()
        heads = [ln for ln in lines if "┃" in ln]
        cells = [ln for ln in lines if "│" in ln]
        if heads and cells:
            assert {ln.count("│") for ln in cells} <= {h.count("┃") for h in heads}, block
