"""CDK Terrain (cdktn) stacks, one per cloud, instantiated per environment from
``environments/*.yaml``: ``stacks.aws``, ``stacks.azure``, ``stacks.openshift``; the
app is ``python -m trainguard.stacks`` (``cdktf.json``). They import ``checker`` only for the rule
parameters and log signatures they turn into alarms, and package the rest."""
