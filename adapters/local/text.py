"""Plain log lines read with metric definitions (name + regex, SageMaker style)."""

from __future__ import annotations

import contextlib
import math
import re
from pathlib import Path

from trainguard.adapters.local.base import (
    CumulativeTime,
    Reader,
    RunBuilder,
    open_text,
    parse_timestamp,
)
from trainguard.adapters.local.definitions import (
    DEFAULT_DEFINITIONS,
    EPOCH_DEFINITIONS,
    PLANNED,
    STEP,
    MetricDefinition,
)
from trainguard.adapters.local.epochs import (
    EPOCH_LINE,
    epochs_as_steps,
    keras_clock,
    keras_epoch,
    steps_across_epochs,
)
from trainguard.adapters.local.errors import FormatError

# An ISO-8601 timestamp at the start of a line, optionally in brackets.
# ISO-8601, or with slashes in the date as MMEngine's logger writes it (2023/06/05 20:10:13);
# after the blanks and up to three bracketed tags a launcher puts before it
# (torchtitan's "[rank0]:[titan] 2026-04-19 12:18:01,628", Megatron's " [2025-03-01 ...]")
_TIMESTAMP = re.compile(
    r"[ \t]*(?:\[[^\]\s]{1,40}\]:?[ \t]?){0,3}"
    r"\[?(\d{4}([-/])\d{2}\2\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
    r"(?:Z|[+-]\d{2}(?::?\d{2})?)?)")
_TS_START = frozenset("0123456789[")
# A line of Python source, which some scripts print at the top of their log (the
# modded-nanogpt records hold their training script): a statement keyword, a call to
# print, an assignment of a call; once such a line has been read, an indented assignment
# too. Its ``val_loss = 0.0`` and ``lr=3e-4`` are no records. A log line such as "epoch =
# 3, loss = 0.5" is none of these, nor "    loss = 0.5" in a log that holds no source.
_SOURCE = re.compile(
    r"\s*(?:(?:def|class|import|from|return|if|elif|for|while|with|assert|raise)\s"
    r"|print\(|[A-Za-z_][\w.]*\s*(?::[^=]*)?[-+*/]?=(?!=)\s*[A-Za-z_][\w.]*\()")
_INDENTED = re.compile(r"(?:\t| {4,})[A-Za-z_][\w.\[\]]*\s*(?::[^=]*)?[-+*/]?=(?!=)")
# A configuration printed whole: argparse's ``Namespace(lr=0.001, ...)``, OLMo's
# ``TrainConfig(...)`` on one line, or the Hugging Face Trainer's ``TrainingArguments(``
# one ``field=value,`` a line. Its ``learning_rate=7e-05`` is a setting, no record: read
# as one, it came before the warm-up's first logged rate and hid the warm-up. Or a dict
# whose first value is a dict, a configuration's sections (so-vits-svc's ``{'train':
# {'log_interval': 200, ...``, DBNet's ``{'arch': {...``): read as a record, it was the
# log's first, so the lines each relaunch writes before training were no opening of a
# new process and the night between two launches a stall. A trainer's metrics dict is
# flat (the Hugging Face Trainer's ``{'loss': 2.1, ...}``).
# Terminal colours a logger writes into a file through ``tee`` (torchtitan's
# "\x1b[32mloss: 9.8"): the key would run on from the escape's letter.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CONFIG = re.compile(r"\b(?:Namespace|[A-Z]\w*(?:Config|Arguments|Args|Params|Settings|Options))\("
                     r"|^\s*\w+=[^=,]*,\s*$")
_CONFIG_DICT = re.compile(r"\{\s*['\"][A-Za-z_]\w*['\"]\s*:\s*\{")

# A configuration printed as YAML (PaddleSeg's, MMEngine's, a script's ``yaml.dump``): a
# lone ``lr_scheduler:`` and the lines indented under it, ``  learning_rate: 0.01``, are
# settings, no records, once the document shows it nests (a lone key or a ``- `` list
# item inside a block). Read as one at a relaunch, that rate wrote the last step again
# there and was taken for the resume, and the new process's iterations up to the old
# one's last were no progress (a stall warned 5 minutes after a relaunch on more GPUs).
# A flat block, ``Validation:`` and its indented ``loss: 0.41``, is still read.
_YAML_KEY = re.compile(r"( *)[A-Za-z_][\w.-]*:\s*$")
_YAML_SIBLING = re.compile(r"[A-Za-z_][\w.-]*: \S")


def _yaml_block(line: str, nest: int, dump: bool) -> tuple[int, bool, bool]:
    """After ``line``: the indent of the YAML block open (or -1), whether the document
    nests; and whether ``line`` is a setting of a nesting document. A line indented
    deeper than the open block's lone key is in it (a lone key or a list item there says
    the document nests); an unindented ``key: value`` is the block's sibling; a lone key
    opens a block; any other line ends the document."""
    indent = len(line) - len(line.lstrip(" "))
    body = line.strip()
    if nest >= 0 and indent > nest and body:
        dump = dump or body.startswith("- ") or body.endswith(":")
        return nest, dump, dump
    key = _YAML_KEY.match(line)
    if key is not None:
        return len(key.group(1)), dump, False
    if nest >= 0 and indent == 0 and _YAML_SIBLING.match(line):
        return nest, dump, False
    return -1, False, False


# what a definition does with its value, in the order a line is read: the time and the
# step first, so the metrics on the same line get them
TIME, STEP_ROLE, PLANNED_ROLE, METRIC = range(4)


def _role(d: MetricDefinition) -> int:
    if d.time:
        return TIME
    return {STEP: STEP_ROLE, PLANNED: PLANNED_ROLE}.get(d.name, METRIC)


Compiled = list[tuple[re.Pattern[str], int, int, str, float, str, re.Pattern[str] | None]]


def compile_definitions(
    definitions: list[MetricDefinition] | tuple[MetricDefinition, ...],
) -> Compiled:
    """(regex, role, name id, name, scale, needle, not_after), the step and time first;
    definitions of one name stay together, and on a line the first of them that matches
    wins (so ``train_time`` in ms and in s can share a name)."""
    ids: dict[tuple[int, str], int] = {}
    out: Compiled = []
    for d in definitions:
        role = _role(d)
        gid = ids.setdefault((role, d.name), len(ids))
        out.append((d.compile(), role, gid, d.name, d.scale, d.needle,
                    re.compile(d.not_after) if d.not_after else None))
    out.sort(key=lambda item: (item[1], item[2]))  # stable: keeps each name's own order
    return out


class TextReader(Reader):
    name = "text"

    def matches_name(self, path: Path) -> bool:
        """A ``.log``, ``.txt`` or ``.out`` file, unless it holds CSV or JSON lines: Keras's
        ``CSVLogger`` writes ``training.log`` in its own docs."""
        if not (path.is_file() and
                path.name.removesuffix(".gz").endswith((".log", ".txt", ".out"))):
            return False
        from trainguard.adapters.local.jsonl import JsonLinesReader
        from trainguard.adapters.local.tabular import CsvReader

        return not (CsvReader().matches_content(path) or JsonLinesReader().matches_content(path))

    def collect(self, path: Path, run: RunBuilder, definitions: list[MetricDefinition] | None,
                select: str | None) -> None:
        try:
            if definitions and not any(d.name == "epoch" for d in definitions):
                definitions = [*definitions, *EPOCH_DEFINITIONS]
            compiled = compile_definitions(definitions or DEFAULT_DEFINITIONS)
        except ValueError as e:
            raise FormatError(path, str(e)) from None
        log = run.log
        # the hot loop appends to the builder's columns itself: a call per record costs
        # more than reading the line
        kind, values, steps = run.kind.append, run.value.append, run.step.append
        walls, elapses, rows = run.wall.append, run.elapsed.append, run.row.append
        entries = [(rx, role, gid, name, scale, needle,
                    run.index(name if role == METRIC else STEP), not_after)
                   for rx, role, gid, name, scale, needle, not_after in compiled]
        clock = CumulativeTime()
        elapsed = step = math.nan
        source = False  # a line of Python source has been read
        timed = stepped = False  # a time field, a step that moved has been read
        epoch_series, epochs = run.index("epoch"), 0
        durations: list[float] = []  # of the Keras epochs read
        nest = -1  # the indent of a YAML mapping's lone key whose block is being read
        dump = False  # ... in a YAML document that nests (a configuration's)
        with open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if "\x1b" in line:
                    line = _ANSI.sub("", line)
                if "\x08" in line:  # a line written over with backspaces: what is left
                    line = line[line.rfind("\x08") + 1:]
                matched = running = False
                head = line.lstrip(" \t")[:1]
                if head.isdigit() and (keras := keras_epoch(line, epochs > 0)) is not None:
                    if keras < 0:
                        # a running mean part-way through the epoch: no record, but one
                        # that is NaN or inf says a batch was, and the epoch's mean will
                        # be (an epoch of 4 hours need not be waited for)
                        lowered = line.lower()
                        if "nan" not in lowered and "inf" not in lowered:
                            continue
                        running = True
                    elif not timed:  # the epoch's duration: the clock (``keras_clock``)
                        durations.append(keras if keras > 0 else 0.0)
                        if keras > 0:
                            elapsed = (0.0 if math.isnan(elapsed) else elapsed) + keras
                ep = EPOCH_LINE.match(line) if head == "E" else None
                if ep is not None:  # once an epoch: no need to spare the call
                    epochs = int(ep.group(2))
                    run.add("epoch", float(ep.group(1)), step, math.nan, elapsed, lineno)
                    matched = True
                # a line's own time: the builder carries it to the lines after it, and
                # tells a log whose progress lines are stamped from one whose are not
                wall = math.nan
                if not source and _SOURCE.match(line):
                    source = True
                if line[:1] in _TS_START or (line[:1] in " \t"
                                             and line.lstrip(" \t")[:1] in _TS_START):
                    ts = _TIMESTAMP.match(line)
                    # a date-like prefix that is no real timestamp leaves the clock alone
                    if ts is not None:
                        with contextlib.suppress(ValueError):
                            wall = parse_timestamp(
                                ts.group(1).replace(",", ".").replace("/", "-"))
                hit = -1
                nested = False
                if nest >= 0 or line.endswith((":\n", ":\r\n", ":")):
                    nest, dump, nested = _yaml_block(line, nest, dump)
                for rx, role, gid, name, scale, needle, series, not_after in (
                        () if nested else entries):
                    if gid == hit or (ep is not None and series == epoch_series
                                      and role == METRIC):
                        continue  # an earlier definition of this name matched
                    if needle and needle not in line:
                        continue  # no line without its key matches it
                    m = rx.search(line)
                    if m is None or (not_after is not None
                                     and not_after.search(line, 0, m.start())):
                        continue
                    text = m.group(1)
                    if text is None:
                        continue
                    if not matched and source and (_SOURCE.match(line)
                                                   or _INDENTED.match(line)):
                        break  # source code, kept as a log line
                    if not matched and (_CONFIG.search(line) or (
                            "{" in line and _CONFIG_DICT.search(line))):
                        break  # a configuration printed whole, kept as a log line
                    try:
                        value = float(text) * scale
                    except ValueError:
                        raise FormatError(path, f"metric {name!r}: cannot read {text!r} "
                                          "as a number", lineno) from None
                    hit = gid
                    matched = True
                    if running and (role != METRIC or math.isfinite(value)):
                        continue  # of a running mean, only its non-finite values
                    if role == TIME:
                        elapsed = clock(value)
                        timed = True
                        continue
                    if role == PLANNED_ROLE:
                        if math.isfinite(value) and value > 0:
                            run.planned_steps = int(value)
                        continue
                    if role == STEP_ROLE:
                        # a step counter: a step that moved (a banner's lone "step=0",
                        # DeepSpeed's, is none)
                        stepped = stepped or (math.isfinite(step) and value != step)
                        step = value
                    # a record: the metric, or the step (progress) with the line's times
                    kind(series)
                    values(value)
                    steps(step)
                    walls(wall)
                    elapses(elapsed)
                    rows(lineno)
                if not matched and not running:
                    text = line.rstrip("\r\n")
                    if text.strip():
                        log(text, step, wall, elapsed, lineno)
        if not stepped:
            epochs_as_steps(run, epoch_series, epochs)
        else:
            steps_across_epochs(run, epoch_series)
        if durations and not timed:
            keras_clock(run, durations)
