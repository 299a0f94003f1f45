"""The config layer, below the runtimes, the stacks and the CLI (above the checker and
the adapters): YAML loading that knows each key's line, the problems and how they are
said, the policy schema, loader and default policy, one ``ConfigError``, each runtime's
``Settings`` (``trainguard.config.settings``) and ``runtime_policy``, which every
runtime uses to turn a policy file and the deployment's stop switch into the policy it
runs."""

from trainguard.config.policy import (
    DEFAULT_POLICY_FILE,
    default_policy,
    default_policy_text,
    load_policy,
    load_policy_text,
    params_model,
    policy_to_dict,
)
from trainguard.config.problems import (
    ConfigError,
    PolicyError,
    Problem,
    load_yaml,
    suggest,
    validation_problems,
)
from trainguard.config.runtime import effective_policy, runtime_policy
from trainguard.config.settings.base import parse_bool
from trainguard.config.yamlfile import Loc, dotted, line_of, parse_yaml

__all__ = [
    "DEFAULT_POLICY_FILE", "ConfigError", "Loc", "PolicyError", "Problem", "default_policy",
    "default_policy_text", "dotted", "effective_policy", "line_of", "load_policy",
    "load_policy_text", "load_yaml", "params_model", "parse_bool", "parse_yaml",
    "policy_to_dict", "runtime_policy", "suggest", "validation_problems",
]
