"""The spellings people give the loss, recognised as the well-known names the rules read.

TensorBoard scalars are ``Loss/val``, ``val/loss``, ``loss/train`` or Keras's
``validation/epoch_loss``; the Hugging Face Trainer logs ``eval_loss``. A run without a
``loss`` or ``val_loss`` series of its own gets that name as a second key for the one
series spelt like it, and the series keeps its own name, so every finding says which
series was judged ("eval_loss" or "Loss/val", not "val_loss"). Nothing is guessed when two
series could be the one: then the policy's ``metrics:`` map decides.
"""

from __future__ import annotations

import re

from trainguard.checker.model import Job

_SPLIT = re.compile(r"[/_.\-\s]+")

#: words that say a loss is measured on held-out data, or on the training data
_VALIDATION = frozenset({"val", "valid", "validation", "eval", "evaluation", "dev"})
_TRAINING = frozenset({"train", "training"})
_LOSS = frozenset({"loss", "epoch_loss", "epoch loss"})

#: the well-known name -> the words one of its spellings carries beside "loss"
ROLES: dict[str, frozenset[str]] = {"val_loss": _VALIDATION, "loss": _TRAINING}


def _words(name: str) -> list[str]:
    return [w for w in _SPLIT.split(name.lower()) if w]


def role_of(name: str) -> str | None:
    """``val_loss`` or ``loss`` when ``name`` is a spelling of it, else None.

    A spelling is the word ``loss`` (Keras's ``epoch`` before it allowed) and one word of
    the role, in any order, and nothing else: ``val/loss``, ``Loss/val``, ``eval_loss``,
    ``validation/epoch_loss``, ``loss/train``; not ``val_loss_ema`` or ``train/aux_loss``.
    """
    words = _words(name)
    if "loss" not in words:
        return None
    rest = [w for w in words if w not in ("loss", "epoch")]
    if len(rest) != 1 or words.count("loss") != 1:
        return None
    for role, marks in ROLES.items():
        if rest[0] in marks:
            return role
    return None


def recognise(job: Job) -> dict[str, str]:
    """Add ``loss`` / ``val_loss`` keys for their spellings in ``job.series``; returns
    what was added (well-known name -> the series' own name)."""
    added: dict[str, str] = {}
    for role in ROLES:
        if role in job.series:
            continue
        spelt = [k for k in job.series if role_of(k) == role]
        if len(spelt) == 1:
            job.series[role] = job.series[spelt[0]]
            added[role] = spelt[0]
    return added
