"""trainguard tests (a package, so that no site-packages ``tests`` can shadow it)."""
