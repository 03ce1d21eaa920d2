"""Training environments written for verifiers 0.4, run as its own EnvServer process."""
