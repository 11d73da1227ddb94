"""t2t_jax: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in JAX/Flax.

The public API is the Translator (apps/translator.py):

    from t2t_jax import Translator
    translations = Translator.from_workdir('runs/demo').translate(['A sentence.'])

Importing the package does nothing else: every submodule import runs this file, so it
imports nothing when it runs (the public names load on first use, through PEP 562's module
`__getattr__`) and touches no environment variable. Entry points (main.py, the benchmarks,
the tests) call `xla.configure_cpu()` first.
"""
from typing import Any

__all__ = ['Hypothesis', 'Translator']


def __getattr__(name: str) -> Any:
  if name in __all__:
    from t2t_jax.apps import translator  # noqa: PLC0415 (the public names load on first use)
    return getattr(translator, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
