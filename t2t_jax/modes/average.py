"""§6.1's average: the mean of the last config.average_last checkpoints (or the best ones,
config.average_select), into WORKDIR/averaged/<step>/."""
from __future__ import annotations

import ml_collections

from t2t_jax.run import averaging


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  step, steps = averaging.average_checkpoints(
      workdir, config.average_last, allow_fewer=config.average_allow_fewer,
      step=config.restore_step, best=config.average_select == 'best')
  return f'averaged checkpoints {steps} into {workdir}/averaged/{step}'
