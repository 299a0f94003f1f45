"""``trainguard bench``: the detection benchmark's numbers on a small labelled set whose
answers are known, its labels file errors, its JSON, and its determinism."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from trainguard.bench.anchors import ANCHORS
from trainguard.bench.command import bench
from trainguard.bench.labels import LabelsError, read_labels
from trainguard.checker.prices import lookup

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("bench")(bench)


@app.command("other")
def _other() -> None:  # a second command, so ``bench`` is a subcommand as in the real CLI
    pass


runner = CliRunner(env={"COLUMNS": "220"})

EVERY = 10.0  # seconds between records in every test run
PRICE = 36.0  # $/h given with --price: savings are hours x 36
HEADER = "run,label,onset_step,target_metric\n"


def _csv(path: Path, n: int, loss: Callable[[int], float]) -> None:
    """A metrics CSV with an elapsed-seconds column: one record every EVERY seconds."""
    lines = ["step,elapsed,loss"] + [f"{i},{i * EVERY},{loss(i)}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Four runs, one per label, and a policy pinning the rule parameters the answers
    depend on (so a change of defaults does not silently change what is tested)."""
    _csv(tmp_path / "diverged.csv", 200, lambda i: math.nan if i >= 100 else 5 / (1 + i / 20))
    _csv(tmp_path / "flat.csv", 200, lambda i: 11.7 + 0.01 * ((i * 7) % 5))
    # healthy, with one bump at step 50 that Keras EarlyStopping (patience 0) stops on
    _csv(tmp_path / "healthy.csv", 200, lambda i: 5 / (1 + i / 20) + (0.5 if i == 50 else 0))
    _csv(tmp_path / "stalled.csv", 150, lambda i: 5 / (1 + i / 20))  # the log stops at 1490 s
    (tmp_path / "labels.csv").write_text(
        HEADER + "diverged.csv,diverged,100,loss\nflat.csv,flat,,loss\n"
        "healthy.csv,healthy,,loss\nstalled.csv,stalled,,loss\n")
    (tmp_path / "policy.yaml").write_text(
        "rules:\n  divergence: {params: {nan_points: 2}}\n"
        "  stall: {params: {min_seconds: 300, factor: 2.5, pause_factor: 1.5}}\n")
    return tmp_path


def _bench(*args: str | Path) -> Any:
    return runner.invoke(app, ["bench", *map(str, args)])


def _json(folder: Path, *extra: str) -> dict[str, Any]:
    result = _bench(folder / "labels.csv", "--policy", folder / "policy.yaml", "--price",
                    str(PRICE), "--format", "json", *extra)
    assert result.exit_code == 0, result.output

    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")

    data: dict[str, Any] = json.loads(result.stdout, parse_constant=no_constants)
    return data


def _head(data: dict[str, Any], detector: str, rule: str | None = None,
          family: str = "all") -> dict[str, Any]:
    """A detector's head-to-head row; an anchor's for its own rule unless ``rule`` says."""
    if rule is None:
        rule = (detector.removeprefix("trainguard ") if detector.startswith("trainguard ")
                else ANCHORS[detector].rule_kind)
    found: list[dict[str, Any]] = [h for h in data["head_to_head"] if h["detector"] == detector
                                   and h["rule"] == rule and h["family"] == family]
    assert len(found) == 1, detector
    return found[0]


def _case(data: dict[str, Any], run: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in data["runs_detail"] if c["id"] == run]
    assert len(found) == 1, run
    return found[0]


def test_divergence_detected_at_the_second_nan_record_not_the_next_tick(corpus: Path) -> None:
    data = _json(corpus)
    tg = _head(data, "trainguard divergence")
    assert tg["recall"] == 1.0 and tg["bad"]["runs"] == 1
    # NaN from step 100 (t=1000 s); nan_points=2 confirms it at step 101 (t=1010 s), not
    # at the 60 s tick that first sees it (t=1020 s)
    crit = _case(data, "diverged.csv")["trainguard"]["divergence"]["critical"]
    assert (crit["step"], crit["time"]) == (101.0, 1010.0)
    assert tg["bad"]["delay_steps_median"] == 1.0
    assert tg["bad"]["delay_min_median"] == pytest.approx(10 / 60)
    # stopping at 1010 s instead of the last record at 1990 s: 980 s of 8 GPUs at $36/h
    assert tg["bad"]["saved_usd"] == pytest.approx(980 / 3600 * PRICE)
    assert tg["bad"]["saved_gpu_hours"] == pytest.approx(980 / 3600 * 8)
    nan = _head(data, "keras_terminate_on_nan")
    assert nan["bad"]["delay_steps_median"] == 0.0  # at the first NaN batch
    assert nan["bad"]["saved_usd"] == pytest.approx(990 / 3600 * PRICE)
    [check] = [c for c in data["bar"] if c["what"].startswith("... within one logging")]
    assert check["passed"] and check["result"] == "1/1"


def test_stall_saves_up_to_the_default_max_runtime_from_its_onset(corpus: Path) -> None:
    data = _json(corpus)
    tg = _head(data, "trainguard stall")
    assert tg["recall"] == 1.0
    warn = _case(data, "stalled.csv")["trainguard"]["stall"]["warning"]
    # the threshold is max(300 s, 2.5 x 10 s, 1.5 x 10 s) = 300 s after the last record,
    # timed to within the 1 s resolution between ticks
    assert 1490 + 300 < warn["time"] <= 1490 + 301
    assert tg["bad"]["delay_min_median"] == pytest.approx(5.0, abs=1 / 60)
    saved_h = (1490 + 86_400 - warn["time"]) / 3600
    assert tg["bad"]["saved_usd"] == pytest.approx(saved_h * PRICE)
    # Debugger's StalledTrainingRule: 1800 s, looked at every 60 s from the start (t=0):
    # the first look past 1490 + 1800 = 3290 s is at 3300 s
    debugger = _head(data, "debugger_stalled_training")
    assert debugger["bad"]["delay_min_median"] == pytest.approx((3300 - 1490) / 60)
    assert "trainguard sooner" in debugger["verdict"]
    [bound] = [c for c in data["bar"] if c["what"].startswith("every stall found")]
    assert bound["passed"]
    assert data["assumptions"]["max_runtime_s"] == 86_400


def test_false_alarms_on_the_healthy_run_and_what_they_throw_away(corpus: Path) -> None:
    data = _json(corpus)
    keras = _head(data, "keras_early_stopping")
    assert keras["false_alarm_rate"] == 1.0  # stops at the bump of step 50 (t=500 s)
    assert keras["healthy"]["lost_usd"] == pytest.approx(500 / 3600 * PRICE)
    plateau = _head(data, "trainguard plateau")
    assert plateau["recall"] == 1.0 and plateau["false_alarm_rate"] == 0.0
    assert keras["verdict"] == "trainguard better: fewer false alarms, same recall"
    for name in ("trainguard divergence", "trainguard stall"):
        assert _head(data, name)["false_alarm_rate"] == 0.0


def test_rows_per_label_count_runs_flagged_and_severities(corpus: Path) -> None:
    data = _json(corpus)
    rows = {(r["detector"], r["group"]): r for r in data["rows"]}
    div = rows[("trainguard divergence", "diverged")]
    assert (div["runs"], div["flagged"], div["warned"], div["critical"]) == (1, 1, 1, 1)
    assert rows[("trainguard stall", "stalled")]["critical"] == 1  # 600 s: 2 x threshold
    assert rows[("keras_early_stopping", "healthy")]["flagged"] == 1
    assert rows[("keras_early_stopping", "healthy")]["warned"] is None  # anchors: no levels
    assert {r["group"] for r in data["rows"]} == {"healthy", "diverged", "flat", "stalled"}


def test_json_states_the_price_and_its_source(corpus: Path) -> None:
    data = _json(corpus)
    assert data["price"]["usd_per_hour"] == PRICE and data["price"]["gpus"] == 8
    assert "--price" in data["price"]["source"]
    assert data["runs"] == 4 and data["cases"] == 4
    assert set(data["settings"]) >= {"tick_s", "inject", "seed"}
    result = _bench(corpus / "labels.csv", "--policy", corpus / "policy.yaml", "--format",
                    "json")
    book = lookup("Standard_ND96isr_H100_v5")
    assert book is not None
    default = json.loads(result.stdout)["price"]
    assert default["usd_per_hour"] == book.usd_per_hour
    assert "Standard_ND96isr_H100_v5" in default["source"]


def test_table_output_shows_each_section_and_the_assumptions(corpus: Path) -> None:
    result = _bench(corpus / "labels.csv", "--policy", corpus / "policy.yaml",
                    "--price", str(PRICE))
    assert result.exit_code == 0, result.output
    for text in ("Head to head", "The bar", "Every detector per label", "$36.00/h",
                 "MaxRuntimeInSeconds 86,400 s", "keras_early_stopping", "trainguard stall"):
        assert text in result.stdout, text


def test_inject_adds_six_labelled_faults_per_healthy_run_reproducibly(corpus: Path) -> None:
    first = _json(corpus, "--inject")
    injected = [c for c in first["runs_detail"] if c["injected"]]
    assert sorted(c["group"] for c in injected) == [
        "injected:divergence", "injected:heartbeat_pause", "injected:nanblip",
        "injected:pause", "injected:slowdown", "injected:spike", "injected:stall",
        "injected:straggler"]
    labels = {c["group"]: c["label"] for c in injected}
    assert labels == {"injected:divergence": "diverged", "injected:heartbeat_pause": "healthy",
                      "injected:nanblip": "healthy", "injected:pause": "healthy",
                      "injected:spike": "healthy", "injected:stall": "stalled",
                      "injected:slowdown": "slowed", "injected:straggler": "slowed"}
    assert all(c["run"] == "healthy.csv" for c in injected)
    again = _json(corpus, "--inject")
    other = _json(corpus, "--inject", "--seed", "7")
    del first["elapsed_s"], again["elapsed_s"]
    assert first["runs_detail"] == again["runs_detail"]
    onset = {c["group"]: c["onset_step"] for c in first["runs_detail"] if c["injected"]}
    other_onset = {c["group"]: c["onset_step"] for c in other["runs_detail"] if c["injected"]}
    assert onset != other_onset


def test_two_processes_give_the_same_numbers_as_one(corpus: Path) -> None:
    one = _json(corpus, "--inject", "--jobs", "1")
    two = _json(corpus, "--inject", "--jobs", "2")
    del one["elapsed_s"], two["elapsed_s"]
    assert one == two


def test_plot_writes_a_png_where_trainguard_and_a_tool_disagree(corpus: Path) -> None:
    out = corpus / "plots"
    result = _bench(corpus / "labels.csv", "--policy", corpus / "policy.yaml", "--plot", out)
    assert result.exit_code == 0, result.output
    pngs = sorted(out.glob("*.png"))
    # Keras EarlyStopping stopped the healthy run and trainguard did not
    assert any("healthy.csv-keras_early_stopping" in p.name for p in pngs)
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)


# --- labels files -----------------------------------------------------------------------------


def test_labels_paths_are_relative_to_the_labels_folder(corpus: Path) -> None:
    rows = read_labels(corpus / "labels.csv")
    assert [r.run for r in rows] == ["diverged.csv", "flat.csv", "healthy.csv", "stalled.csv"]
    assert rows[0].path == corpus / "diverged.csv" and rows[0].onset_step == 100.0
    assert rows[0].line == 2 and rows[1].onset_step is None


@pytest.mark.parametrize(("row", "message"), [
    ("flat.csv,sideways,,loss", "labels.csv:2: label: 'sideways' is not one of healthy, "
                                "spiky, diverged, flat, overfit, stalled"),
    ("flat.csv,diverged,soon,loss", "labels.csv:2: onset_step: 'soon': not a number"),
    ("flat.csv,diverged,-3,loss", "labels.csv:2: onset_step: '-3': must be a finite number"),
    ("gone.csv,healthy,,loss", "labels.csv:2: run: no such file or folder 'gone.csv'"),
    (",healthy,,loss", "labels.csv:2: run: empty"),
])
def test_a_bad_row_is_named_by_file_line_and_column(corpus: Path, row: str,
                                                    message: str) -> None:
    labels = corpus / "labels.csv"
    labels.write_text(HEADER + row + "\n")
    with pytest.raises(LabelsError) as e:
        read_labels(labels)
    assert message in str(e.value)
    result = _bench(labels)
    assert result.exit_code == 2
    assert f"trainguard: error: {corpus}/{message}" in result.output


def test_every_bad_row_is_reported_at_once(corpus: Path) -> None:
    labels = corpus / "labels.csv"
    labels.write_text(HEADER + "flat.csv,healthy,,loss\nflat.csv,healthy,,loss\n"
                      "healthy.csv,healthy,,loss,extra\n")
    with pytest.raises(LabelsError) as e:
        read_labels(labels)
    assert [p.split(": ", 2)[:2] for p in e.value.problems] == [
        [f"{labels}:3", "run"], [f"{labels}:4", "row"]]
    assert "listed twice (first on line 2)" in e.value.problems[0]


def test_a_labels_file_without_the_required_columns(corpus: Path) -> None:
    labels = corpus / "labels.csv"
    labels.write_text("path,verdict\nflat.csv,flat\n")
    result = _bench(labels)
    assert result.exit_code == 2
    assert f"{labels}:1: header: missing column(s) run, label" in result.output
    assert _bench(corpus / "nope.csv").exit_code == 2


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_run_that_cannot_be_read_names_its_labels_line(corpus: Path, jobs: str) -> None:
    """One unreadable run (a bad line; a log with no record) stops no other: the rest are
    judged and reported, the two are listed with their labels lines, and the exit code
    says the input was bad."""
    (corpus / "broken.jsonl").write_text("{not json\n")
    (corpus / "bar.log").write_text("  1/102 [....] - ETA: 19:24 - loss: 0.6917\n")
    labels = corpus / "labels.csv"
    labels.write_text(HEADER + "flat.csv,flat,,loss\nbroken.jsonl,healthy,,loss\n"
                      "bar.log,healthy,,loss\n")
    result = _bench(labels, "--jobs", jobs, "--format", "json")
    assert result.exit_code == 2
    assert f"trainguard: error: {labels}:3: run 'broken.jsonl': " in result.stderr
    assert f"trainguard: error: {labels}:4: run 'bar.log': no records in it" in result.stderr
    data = json.loads(result.stdout)
    assert [c["run"] for c in data["runs_detail"]] == ["flat.csv"]
    assert _head(data, "trainguard plateau")["recall"] == 1.0
    assert [(n["run"], n["error"].split(": ", 1)[0]) for n in data["not_judged"]] == [
        ("broken.jsonl", f"{labels}:3"), ("bar.log", f"{labels}:4")]
    table = _bench(labels, "--jobs", jobs)
    assert table.exit_code == 2
    assert "not judged: 2 of the runs cannot be read" in table.stdout
    assert "Not judged: runs that cannot be read" in table.stdout
    assert "bar.log" in table.stdout.split("Not judged")[-1]


def test_a_run_ending_at_its_first_nan_is_counted_apart_in_the_bar(corpus: Path) -> None:
    # the only NaN is the last record: nan_points=2 has no second point to confirm it
    _csv(corpus / "late.csv", 100, lambda i: math.nan if i == 99 else 5 / (1 + i / 20))
    (corpus / "labels.csv").write_text(HEADER + "diverged.csv,diverged,100,loss\n"
                                       "late.csv,diverged,99,loss\n")
    data = _json(corpus)
    [check] = [c for c in data["bar"] if c["what"] == "every diverged run flagged critical"]
    assert check["result"].startswith("1/1 judgeable; 1 more end at their first non-finite")
    assert not check["passed"] and check["detail"] == ["late.csv"]
    assert _head(data, "trainguard divergence")["recall"] == 0.5
    assert _head(data, "keras_terminate_on_nan")["recall"] == 1.0


def test_a_label_marked_unsure_is_shown_apart_and_counted_nowhere(corpus: Path) -> None:
    """The runs corpus's SOURCES.md: labels marked UNSURE in their notes are "judgement
    calls, not ground truth to fit". Here the flat run is (wrongly, for the test) labelled
    diverged and marked UNSURE: it must not lower recall or break the bar, and the
    judgement-call table says what trainguard and the tools concluded on it."""
    (corpus / "labels.csv").write_text(
        "run,label,onset_step,target_metric,notes\n"
        "diverged.csv,diverged,100,loss,NaN from step 100\n"
        'flat.csv,diverged,0,loss,"never moves; UNSURE (could be a dead run)"\n'
        "healthy.csv,healthy,,loss,\n")
    data = _json(corpus)
    tg = _head(data, "trainguard divergence")
    assert (tg["bad"]["runs"], tg["bad"]["flagged"]) == (1, 1)
    [check] = [c for c in data["bar"] if c["what"] == "every diverged run flagged critical"]
    assert check["passed"] and check["result"] == "1/1"
    [call] = data["judgement_calls"]
    assert (call["run"], call["label"], call["agrees"]) == ("flat.csv", "diverged", False)
    # what trainguard did say: no divergence, a plateau warning
    assert call["trainguard"].startswith("no divergence finding; plateau warning")
    assert call["fired"] == [] and "keras_terminate_on_nan" in call["silent"]
    # still judged, and in the JSON's cases
    assert _case(data, "flat.csv")["unsure"] is True
    assert data["cases"] == 3
    table = _bench(corpus / "labels.csv", "--policy", corpus / "policy.yaml").output
    assert "Judgement calls" in table and "flat.csv" in table
    assert "1 of the runs have a label marked UNSURE" in table
    # without the word, the same row counts: recall falls to 1/2
    (corpus / "labels.csv").write_text(
        (corpus / "labels.csv").read_text().replace("UNSURE", "unsure-ish"))
    data = _json(corpus)
    assert _head(data, "trainguard divergence")["bad"]["runs"] == 2
    assert data["judgement_calls"] == []
