"""verifiers 0.4 environments through their own EnvServer: the wire client, the generate bridge,
the side venv's server process, and the environment the trainer runs (docs/training.md).
"""
