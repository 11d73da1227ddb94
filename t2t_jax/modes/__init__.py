"""The modes of the command line, one module each (config/modes.py names them; main.py maps
each name to its module). Every mode module has the same interface:

  its docstring's first line   what `--help` says of it
  run(config, workdir) -> str  does the mode's work and returns the line the command ends
                               with, which states its result (the BLEU, the file written, the
                               steps averaged); `config` is checked by the rules for the mode,
                               and the mode reads the other flags it needs from cli.FLAGS

Beside `run`, a mode module keeps the functions it is made of, with plain arguments, for the
Python API and the tests.
"""
