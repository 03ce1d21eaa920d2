"""Write a model with a reasoning vocabulary: N extra token ids, each a copy of an ordinary
token, usable only inside think spans.

Thin wrapper: the command is `rlvr.reasoning_vocab.expand.main`, installed as
`rlvr-expand-vocab`; see --help.
"""

from rlvr.reasoning_vocab.expand import main

if __name__ == "__main__":
    main()
