"""Metric definitions for text logs: a name and a regex, as SageMaker ``MetricDefinitions``.

Three names are special: ``step`` gives the step of the line (and of the lines after it),
``planned_steps`` gives ``Job.planned_steps``, and a definition with ``time=True`` is a
cumulative time field that defines the time axis instead of becoming a series.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trainguard.adapters.local.emit_format import EMIT_DEFINITIONS
from trainguard.adapters.local.errors import FormatError
from trainguard.adapters.local.metric import PLANNED, STEP, MetricDefinition

__all__ = ["DEFAULT_DEFINITIONS", "PLANNED", "STEP", "MetricDefinition", "load_definitions",
           "parse_metric_option"]

# A number as training logs print it, including nan and inf, so a bad value is kept and
# a word such as "loss: high" never matches.
# Not followed by a letter or a further ".digit": the ``.4`` of an f-string's ``{loss:.4f}``
# (a script's source printed at the top of its log) or the 12 of ``12.5ms`` is no value.
NUM = (r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w]|\.\d)"
       r"|[-+]?(?i:nan|inf(?:inity)?)\b)")


# a word anywhere before an unqualified key that says the line is about held-out data:
# "Test Set : Mean loss: 0.45", "Epoch [199]/[199]  Validation Phase Loss: 0.028",
# "Test:<TAB>Time 4.750<TAB>Loss 103.79", MMEngine's "Epoch(val) [1][50/500] ... loss:
# 0.9" (not "val_acc": "_" joins words)
_HELD_OUT_BEFORE = r"(?i)\b(?:val|valid|validation|test|eval|evaluation|dev)\b"


def at_word_start(key: str) -> str:
    """``key`` not inside a longer name ("loss" not in "train_loss"). The check is a
    lookbehind after the key, not before it, so the regex keeps its literal prefix and
    searches fast."""
    return key + r"(?<![\w.]" + key + ")"


def _shared(keys: tuple[str, ...]) -> str:
    """The longest text every one of ``keys`` holds (a line without it matches none)."""
    first = min(keys, key=len)
    for n in range(len(first), 1, -1):
        for i in range(len(first) - n + 1):
            if all(first[i:i + n] in k for k in keys):
                return first[i:i + n]
    return ""


# between a key and its value: a quote closing the key, ":" or "=" (or a full-width "："
# as Chinese tutorials print, "Loss：1.98"), a quote opening the value (TRL's trainer
# prints its dict's values as strings, "{'loss': '3.412', ...}")
_SEP = "['\"]?\\s*[:=\uff1a]\\s*['\"]?"


def _kv(name: str, *keys: str) -> tuple[MetricDefinition, ...]:
    """``key=value`` or ``key: value``, for any spelling of the key (the leftmost on the
    line); the key may be quoted (the dict the Hugging Face Trainer prints, ``{'loss':
    2.1095, ...}``). One regex for all the spellings: each definition is a search of every
    line of every log."""
    keys = keys or (name,)
    return (MetricDefinition(name, "(?:" + "|".join(at_word_start(k) for k in keys)
                             + ")" + _SEP + NUM, needle=_shared(keys)),)


def _field_start(key: str) -> str:
    """``key`` where a field begins: at the line's start after up to 8 blanks; right after
    a tab (the Swin and VMamba logger's tab-separated ``loss 2.0148 (1.9972)`` after a
    running average in brackets); after ``|``, ``,``, ``:`` or ``]`` and up to 4 blanks;
    after a number and 1 to 4 blanks (``step 100 loss 2.3``, a time of day ``10:00:00
    step 5``); after `` - `` (Python logging's ``%(asctime)s - %(levelname)s -
    %(message)s``). The key comes first and the context is looked behind it, each width
    its own lookbehind (Python's are fixed-width): a regex that begins with its key
    searches a line several times faster than one that begins with the context."""
    k = re.escape(key)
    behind = [f"^{k}", *(rf"^\s{{{n}}}{k}" for n in range(1, 9)), rf"[|,:\]\t]{k}",
              *(rf"[|,:\]\d]\s{{{n}}}{k}" for n in range(1, 5)), rf"\s-\s{k}"]
    return k + "(?:" + "|".join(f"(?<={b})" for b in behind) + ")"


def _spaced(name: str, *keys: str, not_after: str = "") -> tuple[MetricDefinition, ...]:
    """``key value`` with only spaces between, where a field begins (``_field_start``):
    nanoGPT's ``iter 10: loss 4.5735``, ``step 5 | loss 3.2``, ``step 100 loss 2.3``,
    ``[train] iter 10:``, Megatron's `` iteration   1/ 500 |``, ``... - INFO - step 7``;
    not the ``loss 9.39`` inside "New best loss 9.39 -> saved"."""
    # one regex for all the spellings: each is a search per line of every log
    return (MetricDefinition(name, "(?:" + "|".join(_field_start(k) for k in keys)
                             + r")\s+" + NUM, needle=_shared(keys), not_after=not_after),)


# the words before "loss" that say whose it is ("Val Loss", "validation loss")
_HELD_OUT = ("val", "Val", "validation", "Validation", "valid", "Valid")
_QUALIFIERS = (*_HELD_OUT, "test", "Test", "train", "Train", "training", "Training", "eval",
               "Eval")


def _qualified(words: tuple[str, ...]) -> tuple[str, ...]:
    """"Val Loss", "val loss", "Val loss" for each of ``words``."""
    return tuple(f"{w} {k}" for w in words for k in ("Loss", "loss"))


# after a key "loss" or "Loss": no qualifier word before it, next to it or one word
# away ("val epoch loss:0.347", "Average Training Loss"): a lookbehind of each width; the
# key's own lookbehind keeps "val_loss" out
_BETWEEN = ("", "epoch ", "Epoch ", "batch ", "avg ", "average ", "mean ", "total ", "Total ")


def _unqualified(name: str, *keys: str) -> tuple[MetricDefinition, ...]:
    """``key: value`` as ``_kv``, not where a word before the key says whose it is, next
    to it or anywhere before it that says held-out data."""
    return (MetricDefinition(name, "(?:" + "|".join(at_word_start(k) + "".join(
        f"(?<!{w} {b}{k})" for w in _QUALIFIERS for b in _BETWEEN) for k in keys)
        + ")" + _SEP + NUM, needle=_shared(keys), not_after=_HELD_OUT_BEFORE),)


_STEP_OF_TOTAL = r"\s*[:=]?\s*(\d+)\s*/\s*\d+"
_TOTAL = r"\s*[:=]?\s*\d+\s*/\s*(\d+)"

# Read the modded-nanogpt logs (``step:N/TOTAL val_loss:X train_time:Tms``) and the
# common ``key=value`` / ``key: value`` names of other training scripts.
DEFAULT_DEFINITIONS: tuple[MetricDefinition, ...] = (
    # a global step first: beside it, "[Epoch 001][Step 0240/1200] global_step=1440"
    # counts the epoch's batches
    MetricDefinition(STEP, at_word_start("global_step") + r"['\"]?\s*[:=]\s*" + NUM,
                     needle="global_step"),
    # "Epoch: 2 | Global Step: 2516 | Local Step: 639 // 1877" (Sana's trainer)
    *_kv(STEP, "Global Step", "global step"),
    MetricDefinition(STEP, at_word_start("step") + _STEP_OF_TOTAL, needle="step"),
    MetricDefinition(STEP, at_word_start("Step") + _STEP_OF_TOTAL, needle="Step"),
    # "step=N" anywhere; "step: N" where a field begins or as a quoted key, not in prose
    # ("Effective tokens per optimizer step: 18432" is no step)
    *(MetricDefinition(STEP, at_word_start(k) + r"\s*=\s*" + NUM, needle=k)
      for k in ("step", "Step")),
    MetricDefinition(STEP, "(?:" + "|".join(
        f"{_field_start(k)}|{k}(?<=['\"]{k})" for k in ("step", "Step"))
        + r")['\"]?\s*:\s*" + NUM, needle="tep"),
    # "Iter: 200, train loss: ..." where a field begins
    MetricDefinition(STEP, "(?:" + "|".join(_field_start(k) for k in (
        "iter", "Iter", "iteration", "Iteration")) + r")\s*:\s*" + NUM, needle="ter"),
    *_spaced(STEP, "step", "Step", "iter", "Iter", "iteration", "Iteration"),
    *(MetricDefinition(PLANNED, at_word_start(k) + _TOTAL, needle=k)
      for k in ("step", "Step", "iteration")),
    # MMEngine's logger: "Iter(train) [  50/20000]" (iteration-based loops), and the epoch
    # of "Epoch(train) [3][10/50]" (its iteration restarts each epoch: no step)
    MetricDefinition(STEP, r"Iter\(train\)\s*\[\s*(\d+)/\d+\]", needle="Iter(train)"),
    MetricDefinition(PLANNED, r"Iter\(train\)\s*\[\s*\d+/(\d+)\]", needle="Iter(train)"),
    MetricDefinition("epoch", r"Epoch\(train\)\s*\[(\d+)\]", needle="Epoch(train)"),
    # MMCV's logger (mmdetection 2.x and its kin): "Epoch [3][50/7330]", the epoch and
    # its iteration (which starts again each epoch: the reader carries it on across
    # epochs); a loop's "Epoch [3/10]", "Epoch[3]", "Epoch [199]/[199]", PaddleVideo's
    # "epoch:[  1/100]" (not MMCV's "Epoch(val) [3][500]")
    MetricDefinition("epoch", r"[Ee]poch:?\s?\[\s*(\d+)\s*(?:/\s*\d+\s*)?\]", needle="poch"),
    # ... and LAVIS's (MiniGPT-4, BLIP-2): "Train: data epoch: [0]  [3950/5000]"
    MetricDefinition(STEP, r"[Ee]poch:?\s?\[\s*\d+\s*\]\s*\[\s*(\d+)\s*/\s*\d+\s*\]",
                     needle="poch"),
    # the Swin Transformer's logger (VMamba's and many image models'): "Train: [29/300]
    # [2670/2859]", the epoch and its iteration
    MetricDefinition("epoch", r"Train:\s?\[\s*(\d+)\s*/\s*\d+\s*\]\s?\[", needle="Train:"),
    MetricDefinition(STEP, r"Train:\s?\[\s*\d+\s*/\s*\d+\s*\]\s?\[\s*(\d+)\s*/\s*\d+\s*\]",
                     needle="Train:"),
    # build-nanogpt's log file (Karpathy's GPT-2 reproduction): "19072 train 3.021431",
    # "250 val 3.3417", "250 hella 0.2951"
    MetricDefinition(STEP, r"^(\d+) (?:train|val|hella) \S+\s*$"),
    MetricDefinition("loss", r"^\d+ train " + NUM + r"\s*$"),
    MetricDefinition("val_loss", r"^\d+ val " + NUM + r"\s*$"),
    MetricDefinition("hella", r"^\d+ hella " + NUM + r"\s*$"),
    MetricDefinition("train_time", at_word_start("train_time") + r":(\d+(?:\.\d*)?)ms",
                     time=True, scale=0.001, needle="train_time"),
    MetricDefinition("train_time", at_word_start("train_time") + r":(\d+(?:\.\d*)?)s\b",
                     time=True, needle="train_time"),
    # the CamelCase and spaced spellings scripts print ("TrainLoss=1.87 | ValLoss=1.30")
    *_kv("val_loss", "val_loss", "eval_loss", "ValLoss", "valLoss", *_qualified(_HELD_OUT)),
    *_spaced("val_loss", "val_loss", "val loss", "Val Loss"),
    *_kv("test_loss", "test_loss", *_qualified(("test", "Test"))),
    *_kv("train_loss", "train_loss", "TrainLoss", "trainLoss",
         *_qualified(("train", "Train", "training", "Training"))),
    *_spaced("train_loss", "train_loss", "train loss", "Train Loss", "Train loss",
             "training loss", "Training loss", "Training Loss"),  # mlx-lm: "Train loss 2.4"
    # "loss", not where a word names whose it is: "Validation Loss: 0.41" on a line of
    # its own is the held-out loss, and read as the loss it would sit among the batches'
    *_unqualified("loss", "loss", "Loss"),
    # OLMo's trainer: "[step=1/15000,epoch=0]", then a line per metric
    *_kv("loss", "train/CrossEntropyLoss"),
    *_spaced("loss", "loss", "Loss", not_after=_HELD_OUT_BEFORE),
    # the sum of a detector's losses where no "loss" of its own is logged: detectron2's,
    # YOLOX's and SSD's "total_loss: 1.707", "loss_total 10.812", maskrcnn-benchmark's
    # "losses : 39.66"; OpenNMT's cross-entropy "xent: 10.66"
    *_kv("loss", "total_loss", "loss_total", "losses"),
    *_spaced("loss", "total_loss", "loss_total"),
    *_unqualified("loss", "xent"),
    # an accuracy near 1/K beside a loss at ln K: a K-class task at chance (Keras prints
    # "accuracy: 0.1003 - val_accuracy: 0.1000", older Keras "acc:")
    *_kv("val_accuracy", "val_accuracy", "val_acc", "eval_accuracy",
         *(f"{w} {k}" for w in _HELD_OUT for k in ("accuracy", "Accuracy", "acc", "Acc"))),
    *_kv("train_accuracy", "train_accuracy", "train_acc",
         *(f"{w} {k}" for w in ("train", "Train", "training", "Training")
           for k in ("accuracy", "Accuracy", "acc", "Acc"))),
    *_unqualified("accuracy", "accuracy", "Accuracy", "acc", "Acc"),
    # an RL run's reward, as TRL's GRPO trainer prints it among its dict's keys (not DPO's
    # "rewards/chosen"): the run is then judged by its reward, not its losses
    *_kv("reward", "reward"),
    *_kv("lr", "lr", "learning_rate", "learning rate"),  # Megatron: "learning rate: 2.0E-07"
    *_kv("epoch", "epoch", "Epoch"),
    # a loop's "Epoch 3 | Step 120/6501 | Loss: 0.81": the epoch where a field begins
    *_spaced("epoch", "epoch", "Epoch"),
    # the gradient's norm (a dead gradient is exactly 0): the Trainer's dict, and
    # build-nanogpt's / llm.c's "| norm: 0.2843 |" where a field begins
    *_kv("grad_norm", "grad_norm", "gradient_norm", "grad norm"),
    MetricDefinition("grad_norm", "(?:" + _field_start("norm") + r")\s*[:=]?\s*" + NUM,
                     needle="norm"),
)


def parse_metric_option(option: str) -> MetricDefinition:
    """``NAME[,time][,scale:F]=REGEX`` from the command line, e.g. ``val_loss=val_loss:(\\S+)``.

    The name ends at the first ``=``; the regex may contain any character.
    """
    head, sep, regex = option.partition("=")
    parts = [p.strip() for p in head.split(",")]
    name = parts[0]
    if not sep or not name or not regex:
        raise ValueError(f"--metric {option!r}: expected NAME=REGEX, e.g. "
                         r"'val_loss=val_loss:(\S+)'")
    time, scale = False, 1.0
    for flag in parts[1:]:
        if flag == "time":
            time = True
        elif flag.startswith("scale:"):
            try:
                scale = float(flag.removeprefix("scale:"))
            except ValueError:
                raise ValueError(f"--metric {option!r}: scale {flag[6:]!r} is not a number") \
                    from None
        else:
            raise ValueError(f"--metric {option!r}: unknown option {flag!r} "
                             "(expected 'time' or 'scale:F')")
    definition = MetricDefinition(name, regex, time=time, scale=scale)
    definition.compile()
    return definition


def load_definitions(path: str | Path) -> list[MetricDefinition]:
    """Definitions from a YAML file: a list of ``{Name, Regex}`` (SageMaker's own keys) or
    ``{name, regex, time, scale}``, optionally under a top-level ``metrics:`` key."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc: Any = yaml.safe_load(f)
    except OSError as e:
        raise FormatError(path, e.strerror or str(e)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise FormatError(path, f"not valid YAML: {getattr(e, 'problem', e)}",
                          mark.line + 1 if mark is not None else None) from None
    if isinstance(doc, dict):
        doc = doc.get("metrics", doc.get("MetricDefinitions"))
    if not isinstance(doc, list):
        raise FormatError(path, "expected a list of metric definitions (name and regex)")
    out = []
    for i, item in enumerate(doc, 1):
        if not isinstance(item, dict):
            raise FormatError(path, f"definition {i}: expected a mapping with name and regex")
        low = {str(k).lower(): v for k, v in item.items()}
        unknown = set(low) - {"name", "regex", "time", "scale"}
        if unknown:
            raise FormatError(path, f"definition {i}: unknown field {sorted(unknown)[0]!r}")
        if not isinstance(low.get("name"), str) or not isinstance(low.get("regex"), str):
            raise FormatError(path, f"definition {i}: 'name' and 'regex' must be strings")
        try:
            d = MetricDefinition(low["name"], low["regex"], bool(low.get("time", False)),
                                 float(low.get("scale", 1.0)))
            d.compile()
        except (ValueError, TypeError) as e:
            raise FormatError(path, f"definition {i}: {e}") from None
        out.append(d)
    return out


#: The epoch counters read whatever the definitions: a log's own definitions name the
#: metrics to read, and the epoch says where each record lies (a step counter that starts
#: again each epoch, a log that counts epochs and no steps).
EPOCH_DEFINITIONS = tuple(d for d in DEFAULT_DEFINITIONS if d.name == "epoch")

# The lines trainguard.emit writes (adapters/local/emit_format.py) are read by default too.
DEFAULT_DEFINITIONS = (*DEFAULT_DEFINITIONS, *EMIT_DEFINITIONS)
