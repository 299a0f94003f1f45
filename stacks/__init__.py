"""CDK Terrain (cdktn) stacks, one per cloud, instantiated per environment from
``environments/*.yaml``. Not built yet: see the README's "What exists today"."""
