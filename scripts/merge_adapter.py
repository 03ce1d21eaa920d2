"""Merge a trained LoRA adapter into its base model and save a plain Hugging Face model;
optionally publish it to the Hugging Face Hub with a generated model card.

Thin wrapper: the command is `rlvr.eval.publish.main`, installed as `rlvr-merge-adapter`; see
--help.
"""

from rlvr.eval.publish import main

if __name__ == "__main__":
    main()
