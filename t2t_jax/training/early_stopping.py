"""Early stopping on the dev set (config.early_stopping_patience; not the paper's, which trains
a fixed number of steps, §5.2): training stops after `patience` dev evaluations in a row
without a better config.early_stopping_metric, as fairseq's --patience and Marian's
--early-stopping do.

The evaluations are metrics.jsonl's (a resumed run continues the count), and a stop is
recorded there as {"step": S, "stopped_early": {...}}: resuming a stopped run trains on only
when the patience or the step budget was raised.
"""
from __future__ import annotations

import dataclasses
from typing import Any

STOPPED = 'stopped_early'  # metrics.jsonl's record of a stop


@dataclasses.dataclass
class EarlyStopping:
  """Counts the dev evaluations since the best one.

  metric: 'dev_loss' (lower is better) or 'dev_bleu' (higher). history: {step: value} of the
  evaluations so far (metrics.jsonl's, up to the restored step). since: evaluations at or
  before this step do not count towards the patience (a run resumed with a raised step
  budget starts counting afresh); the best is still the best of all.
  """
  metric: str
  patience: int
  history: dict[int, float] = dataclasses.field(default_factory=dict)
  since: int = 0

  def _better(self, value: float, than: float) -> bool:
    return value < than if self.metric == 'dev_loss' else value > than

  @property
  def best_step(self) -> int | None:
    best = None
    for step in sorted(self.history):  # the first of equal values: a tie is no improvement
      if best is None or self._better(self.history[step], self.history[best]):
        best = step
    return best

  @property
  def waited(self) -> int:
    """Evaluations after the best (and after `since`) that were not better."""
    best = self.best_step
    if best is None:
      return 0
    return sum(1 for step in self.history if step > max(best, self.since))

  def observe(self, step: int, metrics: dict[str, float]) -> bool:
    """Adds `step`'s evaluation (if `metrics` hold the metric); whether training stops here."""
    if self.metric not in metrics:
      return False
    self.history[step] = float(metrics[self.metric])
    return self.patience > 0 and self.waited >= self.patience

  def record(self, step: int, num_train_steps: int) -> dict[str, Any]:
    """What metrics.jsonl keeps of a stop at `step`, and why."""
    best = self.best_step
    return {'metric': self.metric, 'best': self.history[best], 'best_step': best,
            'patience': self.patience, 'num_train_steps': num_train_steps,
            'why': self.reason()}

  def reason(self) -> str:
    best = self.best_step
    name = self.metric.replace('_', ' ')
    return (f'no better {name} than {self.history[best]:.4g} (step {best}) in {self.waited} '
            f'evaluation{"s" if self.waited != 1 else ""} (config.early_stopping_patience='
            f'{self.patience})')


def resumes_past(stop: dict[str, Any], patience: int, num_train_steps: int) -> bool:
  """Whether a run that stopped early (`stop`, its record) trains on under these settings: a
  raised (or disabled, 0) patience, or a raised step budget."""
  return (patience == 0 or patience > int(stop['patience'])
          or num_train_steps > int(stop['num_train_steps']))
