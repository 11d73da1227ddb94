"""`t2t-jax ...` (the console script) and `python -m t2t_jax ...`: the same command line as
`python -m t2t_jax.main ...`.

Imported only as an entry point: its first statement may run the command again in a new
process, with glibc's huge pages for XLA's buffers (platform/hugepages.py), before the rest
of the program is imported.
"""
from t2t_jax.platform import hugepages

hugepages.reexec()

from t2t_jax import main  # noqa: E402  (after the re-exec above)

run = main.run  # the console script's entry point

if __name__ == '__main__':
  run()
