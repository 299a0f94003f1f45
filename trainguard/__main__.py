"""``python -m trainguard``: the ``trainguard`` command (on Python 3.9 and 3.10 it says in
one line that it needs 3.11)."""

from trainguard.cli import app

if __name__ == "__main__":
    app(prog_name="trainguard")
