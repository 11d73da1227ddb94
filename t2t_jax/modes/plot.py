"""A run as one picture: train and dev loss, the learning rate and dev BLEU by step, the
averaged and the best checkpoints marked, into WORKDIR/curves.png.

  python -m t2t_jax.main --workdir=DIR --mode=plot

Read from DIR/metrics.jsonl as training wrote it (platform/metrics.py): a step's last record
wins (a resumed run logs a step again), a line cut short by a kill is skipped with a warning.
The losses are the label-smoothed ones training minimizes (§5.4); dev BLEU is the sacreBLEU of
config.eval_bleu_every_steps. Marked: the checkpoints of the latest average (§6.1,
DIR/averaged/<step>/steps.json) and the best step, the kept checkpoint of lowest dev loss
(what config.decode_params='best' decodes), else the lowest dev loss recorded. TensorBoard
shows the same metrics live: `tensorboard --logdir DIR/tensorboard`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import ml_collections

from t2t_jax.platform import errors, files, metrics
from t2t_jax.platform.metrics import METRICS
from t2t_jax.run import params as params_lib
from t2t_jax.training.checkpoints import AVERAGED, checkpoint_steps

PICTURE = 'curves.png'
# (key in metrics.jsonl, label): the series drawn, by panel.
LOSSES = (('loss', 'train loss'), ('dev_loss', 'dev loss'))
RATE, BLEU = (('learning_rate', 'learning rate'),), (('dev_bleu', 'dev sacreBLEU'),)
Series = list[tuple[int, float]]  # (step, value), by step


@dataclasses.dataclass(frozen=True)
class Curves:
  """What the picture shows: each metric by step, and the steps marked."""
  series: dict[str, Series]  # metrics.jsonl key -> (step, value), by step; absent: never logged
  averaged_step: int | None  # the latest average, averaged/<step>/ (None: never averaged)
  averaged: list[int]  # the checkpoints it is the mean of ([]: none, or not recorded)
  best_step: int | None  # lowest dev loss (None: no dev loss recorded)
  best_kept: bool  # True: among the kept checkpoints; False: of every evaluation recorded

  @property
  def best_label(self) -> str:
    """Which step best_step is, in words."""
    if self.best_step is None:
      return 'no dev loss recorded'
    if self.best_kept:
      return f'best: step {self.best_step}, the kept checkpoint of lowest dev loss'
    return f'best: step {self.best_step}, the lowest dev loss recorded (its checkpoint not kept)'


def read_records(workdir: str) -> list[dict[str, Any]]:
  """DIR/metrics.jsonl's records in order (metrics.records); no file is a MissingFileError."""
  path = os.path.join(workdir, METRICS)
  if not os.path.isfile(path):
    raise errors.MissingFileError(f'{path}: no such file; it is written by training: train '
                                  'first (--mode=train)')
  return metrics.records(workdir)


def by_step(records: list[dict[str, Any]]) -> dict[str, Series]:
  """Each numeric metric's (step, value) pairs, by step, a step's last record winning."""
  values: dict[str, dict[int, float]] = {}
  for record in records:
    for key, value in record.items():
      if key != 'step' and isinstance(value, int | float):
        values.setdefault(key, {})[record['step']] = float(value)
  return {key: sorted(steps.items()) for key, steps in values.items()}


def best_step(workdir: str, series: dict[str, Series]) -> tuple[int | None, bool]:
  """(step, kept): the kept checkpoint of lowest dev loss (params.ranked_steps), else the
  lowest dev loss recorded (ties to the later step, as there), kept False; (None, False)
  without a dev loss."""
  with contextlib.suppress(errors.UserError):  # no kept checkpoint has a dev loss
    return params_lib.ranked_steps(workdir, key='--mode=plot')[0], True
  dev = series.get('dev_loss')
  if not dev:
    return None, False
  return min(dev, key=lambda pair: (pair[1], -pair[0]))[0], False


def curves(workdir: str) -> Curves:
  """What `draw` shows of the run in `workdir`, read from its files; a run with no logged
  step is a UserError saying to train."""
  series = by_step(read_records(workdir))
  if not series:
    raise errors.UserError(f'{os.path.join(workdir, METRICS)}: no step logged yet; train '
                           'first (--mode=train), or longer than config.log_every_steps')
  averages = checkpoint_steps(workdir, AVERAGED)
  averaged_step = averages[-1] if averages else None
  covers = params_lib.averaged_steps(workdir, averaged_step) if averages else None
  step, kept = best_step(workdir, series)
  return Curves(series, averaged_step, covers or [], step, kept)


def draw(data: Curves, path: str, title: str) -> None:
  """The picture, a panel each: losses, learning rate, dev BLEU (if recorded); the average's
  checkpoints shaded and the best step a dashed line on each. Written whole, never through a
  link at `path` (a temporary file, then a rename)."""
  import matplotlib  # noqa: PLC0415 (only study, attention and plot draw: importing it is slow)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # noqa: PLC0415 (after use('Agg'): no display needed)
  panels = [(LOSSES, 'loss (label-smoothed)'), (RATE, 'learning rate')]
  if data.series.get('dev_bleu'):
    panels.append((BLEU, 'dev BLEU'))
  fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels) + 0.6), sharex=True)
  for ax, (keys, ylabel) in zip(axes, panels, strict=True):
    for key, label in keys:
      points = data.series.get(key, [])
      if points:
        ax.plot(*zip(*points, strict=True), marker='o' if key.startswith('dev_') else None,
                markersize=3, label=label)
    _marks(ax, data)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8, loc='upper right')  # losses fall: the corner they leave empty
  axes[-1].set_xlabel('step')
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  temp = f'{path}.tmp-{os.getpid()}.png'
  try:
    with files.disk_write_errors(path, 'the plot'):
      with contextlib.suppress(FileNotFoundError):  # a killed writer's of the same pid
        os.remove(temp)
      with files.open_file(temp, 'xb', 'the plot') as f:  # never through a link
        fig.savefig(f, dpi=100, format='png')
      files.publish(temp, path)
  finally:
    plt.close(fig)
    if os.path.lexists(temp):
      os.remove(temp)


def _marks(ax: Any, data: Curves) -> None:
  """The average's checkpoints (a shaded span, a tick each) and the best step (dashed)."""
  if data.averaged:
    first, last = min(data.averaged), max(data.averaged)
    ax.axvspan(first, last, color='tab:green', alpha=0.12,
               label=f'averaged/{data.averaged_step}: the mean of {len(data.averaged)} '
               f'checkpoints, {first}–{last}')
    for step in data.averaged:
      ax.axvline(step, color='tab:green', alpha=0.4, linewidth=0.8)
  elif data.averaged_step is not None:  # an average older than steps.json
    ax.axvline(data.averaged_step, color='tab:green', linewidth=1,
               label=f'averaged/{data.averaged_step} (its checkpoints not recorded)')
  if data.best_step is not None:
    ax.axvline(data.best_step, color='tab:red', linestyle='--', linewidth=1,
               label=data.best_label)


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  del config  # what the run wrote is the whole input
  data = curves(workdir)
  path = os.path.join(workdir, PICTURE)
  last = max(step for points in data.series.values() for step, _ in points)
  draw(data, path, f'{os.path.basename(os.path.abspath(workdir))}: {last} steps')
  return f'wrote {path} ({data.best_label})'
