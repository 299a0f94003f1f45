"""trainguard: a watchdog for expensive ML training jobs (the CLI and its policy loader)."""
