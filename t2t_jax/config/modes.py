"""The command line's modes (`--mode=NAME`), in the order `--help` lists them. Each has one
module, t2t_jax/modes/NAME.py, whose docstring's first line is its line in `--help`."""

MODES = ('train', 'average', 'eval', 'translate', 'score', 'serve', 'attention', 'export',
         'params', 'study', 'plot', 'help')
# The modes that use a trained run: without --config they read the config it recorded.
RECORDED_MODES = ('average', 'eval', 'translate', 'score', 'serve', 'attention', 'export',
                  'plot')
