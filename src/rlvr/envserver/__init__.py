"""verifiers 0.4 environments, served by 0.4's own EnvServer from a side venv and reached only
through processes and its wire (ZMQ + msgpack)."""
