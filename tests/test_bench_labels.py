"""The labels format of ``trainguard bench`` as it grew for the runs corpus: ``spiky`` and
``overfit`` labels, a ``family`` column and ``--by family``, a ``metrics`` column that
reads a text log, ``json`` as another name for ``hf``; and each bad cell named by
``FILE:LINE: column: reason``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.test_bench import app, runner  # the bench command mounted as in the real CLI
from trainguard.bench.labels import LabelsError, read_labels

HEADER = "run,format,label,family,onset_step,target_metric,metrics\n"


def _csv(path: Path, values: list[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["step,elapsed,loss"] + [f"{i},{i * 10.0},{v}" for i, v in enumerate(values)]
    path.write_text("\n".join(lines) + "\n")


def _falling(n: int) -> list[float]:
    return [5 / (1 + i / 20) for i in range(n)]


def _json(labels: Path, *extra: str) -> dict[str, Any]:
    result = runner.invoke(app, ["bench", str(labels), "--format", "json", *extra])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _detail(data: dict[str, Any], run: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in data["runs_detail"] if c["id"] == run]
    assert len(found) == 1, run
    return found[0]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Two families: ``a`` with a healthy, a spiky and a diverged run; ``b`` a healthy run
    in a text log whose lines only the ``metrics`` column can read."""
    _csv(tmp_path / "a" / "healthy.csv", _falling(200))
    # a NaN storm of 8 records that the run recovers from: TerminateOnNaN stops it
    _csv(tmp_path / "a" / "spiky.csv",
         [math.nan if 100 <= i < 108 else v for i, v in enumerate(_falling(200))])
    _csv(tmp_path / "a" / "diverged.csv",
         [math.nan if i >= 100 else v for i, v in enumerate(_falling(200))])
    lines = [f"Ep {i} | objective {v:.5f}" for i, v in enumerate(_falling(60))]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "train.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "labels.csv").write_text(
        HEADER + "a/healthy.csv,csv,healthy,,,loss,\n"
        "a/spiky.csv,csv,spiky,,100,loss,\n"
        "a/diverged.csv,csv,diverged,,100,loss,\n"
        r"b/train.log,text,healthy,text-logs,,loss,step=^Ep (\d+);loss=objective ([-+0-9.eEnaif]+)"
        "\n")
    return tmp_path


def test_family_defaults_to_the_first_folder_and_metrics_are_parsed(corpus: Path) -> None:
    rows = read_labels(corpus / "labels.csv")
    assert [r.family for r in rows] == ["a", "a", "a", "text-logs"]
    assert [(d.name, d.regex) for d in rows[3].metrics] == [
        ("step", r"^Ep (\d+)"), ("loss", r"objective ([-+0-9.eEnaif]+)")]
    assert rows[0].metrics == ()


def test_the_metrics_column_reads_the_text_log(corpus: Path) -> None:
    data = _json(corpus / "labels.csv")
    case = _detail(data, "b/train.log")
    # 60 epochs read through the row's own definitions: the default ones see nothing here
    assert case["end_step"] == 59.0 and case["metric"] == "loss"
    assert case["clock"] == "step"


def test_a_critical_finding_on_a_spiky_run_is_a_false_alarm(corpus: Path) -> None:
    data = _json(corpus / "labels.csv")
    nan = [h for h in data["head_to_head"] if h["detector"] == "keras_terminate_on_nan"
           and h["family"] == "all"]
    [row] = nan
    # TerminateOnNaN stops the diverged run (recall 1/1) and the spiky one (a false alarm)
    assert (row["bad"]["flagged"], row["bad"]["runs"]) == (1, 1)
    assert (row["healthy"]["flagged"], row["healthy"]["runs"]) == (1, 3)
    spiky = _detail(data, "a/spiky.csv")
    assert spiky["group"] == "spiky" and spiky["anchors"]["keras_terminate_on_nan"]
    rows = {(r["detector"], r["group"]): r for r in data["rows"] if r["family"] == "all"}
    assert rows[("keras_terminate_on_nan", "spiky")]["flagged"] == 1
    checks = {c["what"]: c for c in data["bar"]}
    tg_critical = spiky["trainguard"]["divergence"]["critical"] is not None
    spiky_check = checks["no critical divergence on a spiky run that recovers"]
    assert spiky_check["passed"] is (not tg_critical)
    assert "no critical finding of any rule on a healthy or spiky run" in checks
    # every rule's critical findings are kept per case, judged rule or not
    assert "divergence" in _detail(data, "a/diverged.csv")["critical"]
    assert _detail(data, "a/healthy.csv")["critical"] == {}


def test_by_family_repeats_every_row_per_family(corpus: Path) -> None:
    plain = _json(corpus / "labels.csv")
    assert {r["family"] for r in plain["rows"]} == {"all"}
    data = _json(corpus / "labels.csv", "--by", "family")
    assert {r["family"] for r in data["rows"]} == {"all", "a", "text-logs"}
    fam = {(r["detector"], r["group"]): r for r in data["rows"] if r["family"] == "text-logs"}
    assert fam[("trainguard divergence", "healthy")]["runs"] == 1
    assert ("trainguard divergence", "diverged") not in fam  # no diverged run in that family
    heads = [h for h in data["head_to_head"] if h["family"] == "a"]
    assert {h["rule"] for h in heads} == {"divergence"}  # the only failure family a holds
    result = runner.invoke(app, ["bench", str(corpus / "labels.csv"), "--by", "family"])
    assert result.exit_code == 0, result.output
    for title in ("Head to head: each rule against today's tools (family a)",
                  "Every detector per label (family text-logs)"):
        assert title in result.stdout


def test_json_is_another_name_for_hf(tmp_path: Path) -> None:
    state = {"log_history": [{"step": 10 * i, "epoch": i / 10, "loss": v}
                             for i, v in enumerate(_falling(30))]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    (tmp_path / "labels.csv").write_text(HEADER + "trainer_state.json,json,healthy,,,loss,\n")
    [row] = read_labels(tmp_path / "labels.csv")
    assert row.format == "hf"
    assert _detail(_json(tmp_path / "labels.csv"), "trainer_state.json")["end_step"] == 290.0


@pytest.mark.parametrize(("cells", "column", "reason"), [
    ("text,healthy,,,loss,loss", "metrics", "'loss' is not NAME=REGEX"),
    ("text,healthy,,,loss,loss=objective [0-9.]+", "metrics",
     "must have exactly one capture group, it has 0"),
    ("text,healthy,,,loss,loss=(a)(b)", "metrics", "it has 2"),
    ("text,healthy,,,loss,loss=(unclosed", "metrics", "bad regex"),
    ("text,healthy,,,loss,loss=(a);loss=(b)", "metrics", "loss defined twice"),
    ("csv,healthy,,,loss,loss=(a)", "metrics", "apply to text logs, and format is 'csv'"),
    ("yaml,healthy,,,loss,", "format", "'yaml' is not a known format"),
    ("text,spikey,,,loss,", "label", "'spikey' is not one of healthy, spiky, diverged"),
])
def test_a_bad_cell_is_named_by_file_line_and_column(tmp_path: Path, cells: str, column: str,
                                                     reason: str) -> None:
    (tmp_path / "train.log").write_text("loss=1\n")
    labels = tmp_path / "labels.csv"
    labels.write_text(HEADER + f"train.log,{cells}\n")
    with pytest.raises(LabelsError) as e:
        read_labels(labels)
    [problem] = e.value.problems
    assert problem.startswith(f"{labels}:2: {column}: ")
    assert reason in problem
    result = runner.invoke(app, ["bench", str(labels)])
    assert result.exit_code == 2
    assert f"trainguard: error: {labels}:2: {column}: " in result.output


def test_a_regex_may_hold_a_semicolon_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("it 1; loss 2.5\n")
    (tmp_path / "labels.csv").write_text(
        HEADER + r"train.log,text,healthy,,,loss,step=it (\d+);;loss=; loss ([0-9.]+)" + "\n")
    [row] = read_labels(tmp_path / "labels.csv")
    assert [(d.name, d.regex) for d in row.metrics] == [
        ("step", r"it (\d+);"), ("loss", r"; loss ([0-9.]+)")]


def test_a_labelled_onset_is_what_the_divergence_delay_is_counted_from(tmp_path: Path) -> None:
    """The loss leaves its curve at step 100 (the label's onset) and turns NaN at 150: a
    detection at the NaN is 50 steps late, not on time."""
    values = [v if i < 100 else (40.0 if i < 150 else math.nan)
              for i, v in enumerate(_falling(200))]
    _csv(tmp_path / "late.csv", values)
    (tmp_path / "labels.csv").write_text(HEADER + "late.csv,csv,diverged,,100,loss,\n")
    data = _json(tmp_path / "labels.csv")
    [check] = [c for c in data["bar"] if c["what"].startswith("... within one logging")]
    crit = _detail(data, "late.csv")["trainguard"]["divergence"]["critical"]
    assert crit is not None
    assert check["passed"] is (crit["step"] <= 101) and "labelled" in check["what"]
    if not check["passed"]:
        assert check["detail"] == ["late.csv"]


def test_katib_peers_are_runs_of_the_same_repository(tmp_path: Path) -> None:
    """Katib's median stop compares a trial with the other trials of its experiment: runs of
    unrelated projects that share a folder are not that."""
    header = "run,source,label,target_metric\n"
    worse = [9.0, 9.0, 9.0, 9.0, 9.0]
    for name, values in (("a", _falling(5)), ("b", _falling(5)), ("c", _falling(5)),
                         ("d", worse)):
        _csv(tmp_path / "runs" / f"{name}.csv", values)

    def katib(sources: list[str]) -> Any:
        rows = "".join(f"runs/{n}.csv,{src},healthy,loss\n"
                       for n, src in zip("abcd", sources, strict=True))
        (tmp_path / "labels.csv").write_text(header + rows)
        return _detail(_json(tmp_path / "labels.csv"), "runs/d.csv")["anchors"][
            "katib_median_stop"]

    assert katib(["me/exp@1:a", "me/exp@1:b", "me/exp@1:c", "me/exp@1:d"]) is not None
    assert katib(["x/one@1:a", "y/two@1:b", "z/three@1:c", "me/exp@1:d"]) is None


def test_several_labels_files_are_judged_together(
        corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    other = tmp_path_factory.mktemp("other")
    _csv(other / "c" / "flat.csv", [11.7 + 0.01 * ((i * 7) % 5) for i in range(200)])
    (other / "labels.csv").write_text(HEADER + "c/flat.csv,csv,flat,,,loss,\n")
    data = _json(corpus / "labels.csv", str(other / "labels.csv"), "--by", "family")
    assert data["runs"] == 5
    assert {r["family"] for r in data["rows"]} == {"all", "a", "c", "text-logs"}
    # the same run name in both files is ambiguous: named with both places
    (other / "labels.csv").write_text(HEADER + "a/healthy.csv,csv,healthy,,,loss,\n")
    _csv(other / "a" / "healthy.csv", _falling(50))
    result = runner.invoke(app, ["bench", str(corpus / "labels.csv"),
                                 str(other / "labels.csv")])
    assert result.exit_code == 2
    assert (f"{other / 'labels.csv'}:2: run: 'a/healthy.csv' is also listed at "
            f"{corpus / 'labels.csv'}:2") in result.output


def test_a_given_tick_is_checked_on_every_run_before_any_is_judged(corpus: Path) -> None:
    # a run of 20,000 s: 20 million ticks of 1 ms, a unit mistake
    (corpus / "a" / "long.csv").write_text("step,elapsed,loss\n0,0,3\n1,10000,2\n2,20000,1\n")
    labels = corpus / "labels.csv"
    labels.write_text(labels.read_text() + "a/long.csv,csv,healthy,,,loss,\n")
    for jobs in ("1", "2"):
        result = runner.invoke(app, ["bench", str(labels), "--tick", "0.001", "--jobs", jobs])
        assert result.exit_code == 2, result.output
        assert f"{labels}:6: run 'a/long.csv': tick 0.001 makes 20,000,001 ticks" \
            in result.output
        assert "at most 10,000,000" in result.output


def test_a_stall_found_after_the_bound_is_found_late_not_missed(tmp_path: Path) -> None:
    """Five records 30 s apart, then the log stops: two update gaps after the warm-up,
    too little history to learn a cadence from, so the stall rule waits its floor (longer
    than the bar's 10 min bound)."""
    lines = ["step,elapsed,loss"] + [f"{i},{30.0 * i},{3 - 0.1 * i}" for i in range(5)]
    (tmp_path / "stalled.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "labels.csv").write_text(HEADER + "stalled.csv,csv,stalled,,,loss,\n")
    data = _json(tmp_path / "labels.csv")
    warn = _detail(data, "stalled.csv")["trainguard"]["stall"]["warning"]
    assert warn is not None and warn["time"] - 120.0 > 600.0  # found, after the bound
    [head] = [h for h in data["head_to_head"] if h["detector"] == "trainguard stall"
              and h["family"] == "all"]
    assert head["bad"]["flagged"] == 1
    [bound] = [c for c in data["bar"] if c["what"].startswith("every stall found within")]
    assert not bound["passed"] and bound["detail"] == ["stalled.csv"]


def test_the_word_unsure_in_the_notes_marks_a_judgement_call(tmp_path: Path) -> None:
    _csv(tmp_path / "a.csv", _falling(20))
    labels = tmp_path / "labels.csv"
    labels.write_text("run,label,notes\na.csv,healthy,\"n=20; UNSURE (short)\"\n"
                      "b.csv,flat,reads as UNSUREly flat\nc.csv,diverged,unsure\n")
    for name in ("b.csv", "c.csv"):
        _csv(tmp_path / name, _falling(20))
    rows = read_labels(labels)
    # the word itself, in capitals, as the corpus writes it; not a part of another word
    assert [r.unsure for r in rows] == [True, False, False]
