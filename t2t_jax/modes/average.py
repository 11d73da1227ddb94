"""§6.1's average: the mean of the last config.average_last checkpoints (or the best ones,
config.average_select), into WORKDIR/averaged/<step>/, with its dev loss beside each member's."""
from __future__ import annotations

import ml_collections
from absl import logging

from t2t_jax.platform import metrics
from t2t_jax.run import averaging, dev_loss
from t2t_jax.run import params as params_lib


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  best = config.average_select == 'best'
  if best:  # what it chooses by, before the minutes of reading
    losses = metrics.dev_losses(workdir)
    ranked = params_lib.ranked_steps(workdir, key="config.average_select='best'")
    logging.info("config.average_select='best': the %d of lowest dev loss of the kept "
                 'checkpoints (%s).', config.average_last,
                 ', '.join(f'{s}: {losses[s]:.4f}' for s in sorted(ranked)))
  measure = dev_loss.DevLoss(config, workdir) if dev_loss.has_dev_set(config) else None
  if measure is None:
    logging.info('No dev set (config.dev_files): the average\'s dev loss is not measured.')
  step, steps = averaging.average_checkpoints(
      workdir, config.average_last, allow_fewer=config.average_allow_fewer,
      step=config.restore_step, best=best, dev_loss=measure)
  line = f'averaged checkpoints {steps} into {workdir}/averaged/{step}'
  record = params_lib.average_record(workdir, step)
  if record is None or record.dev_loss is None or not record.members_dev_loss:
    return line
  members = record.members_dev_loss
  logging.info('Dev loss of averaged/%d: %.4f; of its checkpoints: %s.', step, record.dev_loss,
               ', '.join(f'{s}: {loss:.4f}' for s, loss in sorted(members.items())))
  best_member = min(members, key=lambda s: (members[s], -s))
  if record.dev_loss > members[best_member]:
    logging.warning(
        'The average is worse on the dev set than its best checkpoint: dev loss %.4f against '
        '%.4f of checkpoints/%d. Decoding uses the average (config.decode_params=\'auto\'); '
        'decode with the checkpoint of lowest dev loss instead: --config.decode_params=best '
        '(or --config.decode_params=checkpoint --config.restore_step=%d).',
        record.dev_loss, members[best_member], best_member, best_member)
  return (f'{line}: dev loss {record.dev_loss:.4f}, its checkpoints\' '
          f'{min(members.values()):.4f}–{max(members.values()):.4f}')
