"""The cdktn app (``cdktf.json``: ``app``). The stacks are not built yet, so it says so and
fails rather than synthesising nothing."""

import sys

sys.exit("trainguard: the stacks are not built yet (no environments to synthesise); "
         "see README.md, 'What exists today'")
