"""The built-in rules: every module of this package (``base`` aside) defines rules and
registers them with ``@register``. Importing the package imports each module, so a new
rule file is picked up with no list to edit (``checker.registry.rules`` walks it too)."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
