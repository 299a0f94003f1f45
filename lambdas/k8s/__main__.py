"""``python -m trainguard.lambdas.k8s``: the CronJob container's entry point."""

import sys

from trainguard.lambdas.k8s.cronjob import main

if __name__ == "__main__":
    sys.exit(main())
