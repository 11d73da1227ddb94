"""t2t_jax: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in JAX/Flax."""
import os

# XLA:CPU hands reductions to YNNPACK by default (jaxlib 0.10); for the softmax over a 37k
# vocabulary that is ~2× slower than XLA's own loops, and beam search spends a quarter of
# its time there. Dots and elementwise fusions keep YNNPACK. Only CPU compilation reads the
# flag, and only if it is set before JAX creates its CPU backend: importing t2t_jax first
# (as main.py, the benchmarks and the tests do) is enough. An explicit setting wins.
_YNN_FLAG = '--xla_cpu_experimental_ynn_fusion_type'
if _YNN_FLAG not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {_YNN_FLAG}=-reduce".strip()
