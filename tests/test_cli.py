"""The ``trainguard`` command line as a user runs it: exit codes, output, files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from trainguard.checker.registry import RULES, rule_names
from trainguard.cli import app

runner = CliRunner(env={"COLUMNS": "200"})


def _run(*args: str | Path) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def _json(text: str) -> Any:
    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=no_constants)


def _csv(path: Path, n: int = 200, nan_from: int | None = None) -> Path:
    """A Lightning-style metrics.csv: a steadily falling loss, NaN from ``nan_from``."""
    rows = ["step,loss"]
    for i in range(n):
        loss = math.nan if nan_from is not None and i >= nan_from else 5.0 / (1 + i / 20)
        rows.append(f"{i},{loss}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")
    return path


def _timed_log(path: Path, n: int = 400, nan_from: int = 200) -> Path:
    """A speed-run style text log: one step a second (``train_time`` in ms)."""
    lines = []
    for i in range(n):
        loss = "nan" if i >= nan_from else f"{5.0 / (1 + i / 50):.4f}"
        lines.append(f"step:{i}/{n} train_loss:{loss} train_time:{i * 1000}ms step_avg:1000ms")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _assert_clean_error(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # handled, not a crash
    assert "Traceback" not in result.output
    err = result.stderr
    assert err.startswith("trainguard: error: ")
    for needle in needles:
        assert needle in err, err


# --- check ----------------------------------------------------------------------------------

def test_healthy_run_exits_0(tmp_path: Path) -> None:
    result = _run("check", _csv(tmp_path / "good.csv"))
    assert result.exit_code == 0, result.output
    assert "good" in result.stdout and "critical" not in result.stdout


def test_diverged_run_exits_1_with_a_json_report(tmp_path: Path) -> None:
    path = _csv(tmp_path / "bad.csv", nan_from=150)
    result = _run("check", path, "--format", "json")
    assert result.exit_code == 1, result.output
    doc = _json(result.stdout)
    assert doc["schema"] == "trainguard.check/v1" and doc["command"] == "check"
    assert doc["verdict"] == "critical"
    [run] = doc["runs"]
    assert {"id", "path", "format", "clock", "verdict", "findings"} <= set(run)
    assert (run["id"], run["path"], run["format"], run["clock"]) == ("bad", str(path), "csv",
                                                                     "step")
    crit = [f for f in run["findings"] if f["severity"] == "critical"]
    assert crit and crit[0]["rule"] == "divergence"
    assert crit[0]["step"] == 150.0
    for f in run["findings"]:
        assert {"rule", "severity", "step", "time", "message", "evidence", "burnt_usd",
                "projected_usd", "action"} <= set(f)


def test_unreadable_file_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.csv"
    path.write_text("step,loss\n0,1.0\n1,oops\n")
    _assert_clean_error(_run("check", path), f"{path}:3", "oops")


def test_missing_file_exits_2(tmp_path: Path) -> None:
    _assert_clean_error(_run("check", tmp_path / "nope.csv"), "nope.csv")


def test_bad_policy_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: team\nrules:\n  divergence:\n    params:\n      nan_pointz: 3\n")
    result = _run("check", _csv(tmp_path / "good.csv"), "--policy", policy)
    _assert_clean_error(result, f"{policy}:5", "nan_pointz")


def test_policy_changes_the_verdict(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  divergence:\n    enabled: false\n")
    path = _csv(tmp_path / "bad.csv", nan_from=150)
    result = _run("check", path, "--policy", policy, "--format", "json")
    assert all(f["rule"] != "divergence" for f in _json(result.stdout)["runs"][0]["findings"])


def test_folder_input_reads_every_recognised_run_recursively(tmp_path: Path) -> None:
    _csv(tmp_path / "a" / "one.csv")
    _csv(tmp_path / "a" / "b" / "two.csv", nan_from=100)
    _csv(tmp_path / "three.csv")
    _timed_log(tmp_path / "c" / "four.log", nan_from=10_000)
    (tmp_path / "notes.md").write_text("# not a run\n")
    result = _run("check", tmp_path, "--format", "json")
    assert result.exit_code == 1, result.output  # two.csv diverged
    doc = _json(result.stdout)  # the progress bar (4 files) went to stderr, not here
    assert sorted(r["id"] for r in doc["runs"]) == ["four", "one", "three", "two"]
    by_id = {r["id"]: r for r in doc["runs"]}
    assert by_id["two"]["verdict"] == "critical" and by_id["four"]["format"] == "text"
    assert by_id["four"]["clock"] == "elapsed"


def test_metric_definitions_read_a_custom_log(tmp_path: Path) -> None:
    log = tmp_path / "custom.log"
    lines = [f"it {i} | myloss {3.0 - i / 100:.3f}" if i < 60 else f"it {i} | myloss nan"
             for i in range(100)]
    log.write_text("\n".join(lines) + "\n")
    plain = _run("check", log, "--format", "json")
    assert plain.exit_code == 0  # the default definitions do not know "myloss"
    defined = _run("check", log, "--format", "json", "--metric", r"step=it (\d+)",
                   "--metric", r"loss=myloss (\S+)")
    assert defined.exit_code == 1, defined.output
    [finding] = [f for f in _json(defined.stdout)["runs"][0]["findings"]
                 if f["severity"] == "critical"]
    assert finding["rule"] == "divergence" and finding["step"] == 60.0


def test_bad_metric_option_exits_2(tmp_path: Path) -> None:
    result = _run("check", _csv(tmp_path / "good.csv"), "--metric", "loss=no group")
    _assert_clean_error(result, "--metric", "capture group")


def test_check_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "plots" / "run.png"
    result = _run("check", _csv(tmp_path / "bad.csv", nan_from=150), "--plot", out)
    assert result.exit_code == 1
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


# --- replay ---------------------------------------------------------------------------------

def test_replay_reports_first_fire_and_savings(tmp_path: Path) -> None:
    log = _timed_log(tmp_path / "run.log", n=400, nan_from=200)
    result = _run("replay", log, "--tick", "30", "--price", "36", "--gpus", "8",
                  "--format", "json")
    assert result.exit_code == 1, result.output
    doc = _json(result.stdout)
    assert doc["schema"] == "trainguard.check/v1" and doc["command"] == "replay"
    [run] = doc["runs"]
    assert (run["tick"], run["tick_unit"], run["clock"]) == (30, "s", "elapsed")
    assert run["ticks"] == 15  # 0, 30, ..., 420: the first tick at or past the last record
    crit = next(f for f in run["findings"] if f["severity"] == "critical")
    first = crit["first_fired"]
    fired = first if first["severity"] == "critical" else crit["escalations"][-1]
    # a tick, on or after the NaN at 200 s, and the step logged by then (one step a second)
    assert fired["time"] % 30 == 0 and 200 <= fired["time"] <= 290
    assert fired["step"] == fired["time"]
    s = run["savings"]
    assert s["stop_time"] == fired["time"] and s["end_time"] == 399.0
    assert s["remaining_hours"] == pytest.approx((399.0 - fired["time"]) / 3600)
    assert s["usd"] == pytest.approx(36 * s["remaining_hours"])
    assert s["gpu_hours"] == pytest.approx(8 * s["remaining_hours"])
    assert crit["savings"] == s


def test_replay_table_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "replay.png"
    result = _run("replay", _timed_log(tmp_path / "run.log"), "--tick", "60", "--price", "10",
                  "--plot", out)
    assert result.exit_code == 1
    assert "divergence" in result.stdout and "would have saved" in result.stdout
    assert out.stat().st_size > 5000


def test_replay_on_a_step_clock_ticks_in_steps(tmp_path: Path) -> None:
    result = _run("replay", _csv(tmp_path / "bad.csv", nan_from=150), "--tick", "10",
                  "--format", "json")
    [run] = _json(result.stdout)["runs"]
    assert run["tick_unit"] == "step"
    assert run["savings"]["usd"] is None and run["savings"]["remaining_steps"] > 0


# --- rules and policies -----------------------------------------------------------------------

def test_rules_lists_every_rule_and_parameter() -> None:
    result = _run("rules")
    assert result.exit_code == 0
    for name in rule_names():
        assert name in result.stdout
        for param, _, _ in RULES[name].describe():
            assert param in result.stdout, (name, param)


def test_policy_show_prints_a_policy_that_loads_back(tmp_path: Path) -> None:
    src = tmp_path / "team.yaml"
    src.write_text("name: team\nrules:\n  divergence:\n    params:\n      nan_points: 4\n")
    result = _run("policy", "show", src)
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert data["name"] == "team"
    assert set(data["rules"]) == set(rule_names())  # every rule, defaults filled in
    assert data["rules"]["divergence"]["params"]["nan_points"] == 4
    shown = tmp_path / "shown.yaml"
    shown.write_text(result.stdout)
    again = _run("policy", "check", shown)
    assert again.exit_code == 0, again.output


def test_policy_check_rejects_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsafety:\n  max_stops_per_tick: -1\n")
    _assert_clean_error(_run("policy", "check", bad), f"{bad}:3", "max_stops_per_tick")


# --- real data ------------------------------------------------------------------------------

@pytest.mark.realdata
def test_genrisk_divergence_is_critical(curves_dir: Path) -> None:
    result = _run("check", curves_dir / "genrisk" / "version_0.csv", "--format", "json")
    assert result.exit_code == 1, result.output
    [run] = _json(result.stdout)["runs"]
    assert run["verdict"] == "critical"
    assert any(f["rule"] == "divergence" and f["severity"] == "critical"
               for f in run["findings"])


def _keys(value: Any, prefix: str = "") -> set[str]:
    """Every object key in a JSON value, except inside the rule-specific ``evidence``."""
    if isinstance(value, dict):
        out = set()
        for k, v in value.items():
            out.add(k)
            if k != "evidence":
                out |= _keys(v)
        return out
    if isinstance(value, list):
        return set().union(*(_keys(v) for v in value)) if value else set()
    return set()


def test_every_json_field_is_documented(tmp_path: Path) -> None:
    doc = (Path(__file__).parent.parent / "docs" / "json-schema.md").read_text()
    log = _timed_log(tmp_path / "run.log")
    emitted = _keys(_json(_run("check", log, "--format", "json", "--price", "5").stdout))
    emitted |= _keys(_json(_run("replay", log, "--format", "json", "--price", "5").stdout))
    undocumented = {k for k in emitted if f"`{k}`" not in doc}
    assert not undocumented, f"fields missing from docs/json-schema.md: {sorted(undocumented)}"


# --- watch ----------------------------------------------------------------------------------

def test_watch_reports_a_diverged_run_and_writes_its_outcome(tmp_path: Path) -> None:
    out = tmp_path / "watch.json"
    result = _run("watch", _csv(tmp_path / "bad.csv", nan_from=150), "--tick", "0.1",
                  "--until", "0.05", "--state", tmp_path / "state.sqlite", "--json", out)
    assert result.exit_code == 1, result.output
    assert "divergence" in result.stdout
    [run] = _json(out.read_text())["runs"]
    assert any(f["rule"] == "divergence" and f["severity"] == "critical"
               for f in run["findings"])


def test_watch_rejects_a_pid_for_a_file_it_does_not_watch(tmp_path: Path) -> None:
    result = _run("watch", _csv(tmp_path / "a.csv"), "--pid", f"{tmp_path / 'other.log'}=1",
                  "--until", "0", "--state", tmp_path / "state.sqlite")
    _assert_clean_error(result, "other.log")


def test_a_folder_check_skips_csv_files_that_are_not_training_logs(tmp_path: Path) -> None:
    """A labels file or results table beside the runs is not taken for a run."""
    (tmp_path / "labels.csv").write_text("run,label\nrun1.csv,healthy\n")
    (tmp_path / "run1.csv").write_text("step,loss\n0,2.0\n1,1.9\n")
    res = CliRunner().invoke(app, ["check", str(tmp_path), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert [r["id"] for r in json.loads(res.stdout)["runs"]] == ["run1"]
