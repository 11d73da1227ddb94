"""t2t_jax: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in JAX/Flax.

Importing the package does nothing else: no environment variable is touched. Entry points
(main.py, the benchmarks, the tests) call `xla.configure_cpu()` first.
"""
