"""`t2t-jax ...` (the console script) and `python -m t2t_jax ...`: the same command line as
`python -m t2t_jax.main ...`.

Imported only as an entry point: `--help` answers first, before anything heavy is imported;
then the command may run again in a new process, with glibc's huge pages for XLA's buffers
(platform/hugepages.py), before the rest of the program is imported.
"""
import sys

from t2t_jax import cli

cli.exit_if_help(sys.argv)

from t2t_jax.platform import hugepages  # noqa: E402  (after the help above)

hugepages.reexec()

from t2t_jax import main  # noqa: E402  (after the re-exec above)

run = main.run  # the console script's entry point

if __name__ == '__main__':
  run()
