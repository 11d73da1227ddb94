"""t2t_jax: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in JAX/Flax."""
