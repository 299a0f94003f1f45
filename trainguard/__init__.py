"""trainguard: a watchdog for expensive ML training jobs.

One import namespace: ``trainguard.checker``, ``trainguard.adapters``,
``trainguard.config``, ``trainguard.lambdas`` and ``trainguard.stacks`` (folders at the
repository's top, linked here), the CLI (``trainguard.cli``), and the training side,
``trainguard.emit``, ``trainguard.callbacks`` and ``trainguard.launch``, which runs on
Python 3.9+ with the standard library alone. So this module imports nothing.
"""
