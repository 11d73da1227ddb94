"""Forced scoring: how likely a trained run finds given translations (fairseq's --score-reference,
marian-scorer), for filtering back-translated pairs and reranking n-best lists.

A pair's score is the one beam search (§6.1) gives that output, log P(Y|X) / lp(Y) with EOS
(decode.py), so that the search's own output scores what the search said, where its text
encodes back to the pieces the search chose (the text is re-encoded, canonically); an ensemble's
token log-probabilities are the mean of the models' (decode.ensemble_steps). Pairs are
teacher-forced in the decoding plan's batches (batch_plan.py), each device its own rows.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from t2t_jax.data.tokenizer import PAD_ID
from t2t_jax.decoding import batch_plan, decode
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform.mesh import AXIS, shard_batch

# (params, src [rows, S], targets [rows, T]) -> each target token's log-probability [rows, T]
Scorer = Callable[[Any, jax.Array, jax.Array], jax.Array]


class Scored(NamedTuple):
  """A pair's scores under the model."""
  score: float  # log P(Y|X) / lp(Y): the beam search's score of this output
  logprob: float  # log P(Y|X)
  tokens: list[float]  # each target token's log-probability, EOS last


def make_scorer(model_config: ModelConfig | decode.Ensemble, mesh: Mesh, *,
                weights: Sequence[float] | None = None) -> Scorer:
  """The teacher-forced log-probabilities of target tokens, jitted, each device its own rows;
  an ensemble's (tuples) are the models' mean a token, weighted by `weights` if given."""
  models = [Transformer(c.replace(deterministic=True, decode=False))
            for c in decode.members(model_config)]

  def token_logprobs(params: Any, src: jax.Array, targets: jax.Array) -> jax.Array:
    members = params if isinstance(model_config, tuple) else (params,)
    total = jnp.zeros(targets.shape, jnp.float32)
    for i, (model, member) in enumerate(zip(models, members, strict=True)):
      logits = model.apply({'params': member}, src, targets).astype(jnp.float32)  # [b, t, v]
      logp = jax.nn.log_softmax(logits, axis=-1)
      logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [b, t]
      total = total + (logp if weights is None else logp * weights[i])
    mean = total / len(models) if weights is None else total
    return jnp.where(targets != PAD_ID, mean, 0.0)  # [b, t]

  return jax.jit(jax.shard_map(token_logprobs, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS)),
                               out_specs=P(AXIS), check_vma=False))


def score_ids(scorer: Scorer, params: Any, sources: Sequence[Sequence[int]],
              targets: Sequence[Sequence[int]], config: ml_collections.ConfigDict, mesh: Mesh,
              *, alpha: float) -> list[Scored]:
  """Scored of each (source ids, target ids) pair, EOS ending both, in input order."""
  results: list[Scored | None] = [None] * len(sources)
  lengths = [max(len(s), len(t)) for s, t in zip(sources, targets, strict=True)]
  for indices, rows, length in batch_plan.config_batches(lengths, config, mesh.size):
    src, tgt = (np.full((rows, length), PAD_ID, np.int32) for _ in range(2))
    for r, i in enumerate(indices):
      src[r, :len(sources[i])], tgt[r, :len(targets[i])] = sources[i], targets[i]
    mine = batch_plan.process_rows(rows)
    batch = shard_batch({'src': src[mine], 'tgt': tgt[mine]}, mesh)
    logp = batch_plan.gather_rows(scorer(params, batch['src'], batch['tgt']))
    for r, i in enumerate(indices):
      tokens = logp[r, :len(targets[i])].astype(np.float64)
      total = float(tokens.sum())
      results[i] = Scored(total / float(decode.length_penalty(len(targets[i]), alpha)), total,
                          tokens.tolist())
  return results


def format_scores(scored: Sequence[Scored], *, per_token: bool = False) -> str:
  """A line a pair: its score (6 decimals); per_token: `SCORE ||| LOGPROB ||| t1 t2 ...`."""
  lines = [f'{s.score:.6f}' for s in scored]
  if per_token:
    lines = [f'{line} ||| {s.logprob:.6f} ||| ' + ' '.join(f'{t:.6f}' for t in s.tokens)
             for line, s in zip(lines, scored, strict=True)]
  return ''.join(line + '\n' for line in lines)
