"""Evaluation sweeps: models x environment settings x seeds, each cell one vf-eval run, then one
report with a table per metric and plots.

Comparing several checkpoints under several settings (say MuSiQue's retrievers) is many vf-eval
runs that must share everything else (examples, rollouts, token budget, sampling) to be
comparable. A sweep keeps those shared settings in `OUT/sweep.json` and refuses to add cells
made with different ones; each cell is saved under `OUT/cells/<model>/<setting>/<seed>/`,
renamed into place only once vf-eval has finished, so an interrupted sweep resumes by running
the cells that are missing and nothing else.

Seeds set the environment's own `seed` argument (every environment here takes one: which
problems are generated, which distractors are drawn, which start positions are played); the
sampling is not seeded, so seeds are also independent replicates of the sampling. Where a
setting has several seeds the report also pools them, clustering rollouts by prompt: the
example (what the model saw), not the seed, is the unit of independence.
"""
