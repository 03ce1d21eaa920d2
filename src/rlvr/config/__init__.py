"""Run configuration: typed sections, the GRPO and SFT schemas, the YAML + dotted-override
loader, and the command lines of the scripts."""

from rlvr.config.grpo import *  # noqa: F401,F403  (temporary until the split)
