"""`python -m t2t_jax.data.demo_corpus --out DIR [--num_train N ...]`: writes the demo corpus."""
from __future__ import annotations

from t2t_jax.data.demo_corpus.writer import main

if __name__ == '__main__':
  main()
