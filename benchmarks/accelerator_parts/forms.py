"""The forms part: the price of each lever of kernels.py, side by side with the 'xla' forms.

Every form is a config.model setting a run can use: a config.model.kernels value (the plain
forms, the CPU's, or the plain ones with levers: kernels.LEVERS), or, for the floor, the plain
forms with config.model.dropout_rate=0.0.
"""
from __future__ import annotations

import time

from accelerator_parts.shared import (
  compile_all,
  decode_params,
  emit,
  failed,
  prepare_search,
  prepare_train,
  progress,
  time_search,
  time_steps,
)
from t2t_jax.platform import mesh as mesh_lib

# The train step's candidates: config.model keys to set, each form on the base bf16 step.
FORMS = {
    'xla': dict(kernels='xla'),
    'one-pass loss': dict(kernels='xla+one_pass_loss'),
    'fused attention': dict(kernels='xla+fused_attention'),  # cuDNN's where it serves
    'rbg dropout bits': dict(kernels='xla+rbg_dropout'),
    'hash dropout bits': dict(kernels='xla+hash_dropout'),
    'all levers': dict(kernels='xla+one_pass_loss+fused_attention+rbg_dropout'),
    # The floor: no bits drawn and no mask applied, so the price of dropout whole (§5.4's
    # P_drop = 0.1), of which the bits are most.
    'no dropout': dict(kernels='xla', dropout_rate=0.0),
    'cpu forms': dict(kernels='cpu'),
}
# The beam search's candidates (the encoder's attention is the lever's; the decoder's runs
# over its cache). 'cpu forms' brings the CPU's top-k and maximum, with its cache layout.
DECODE_FORMS = {
    'xla': dict(kernels='xla'),
    'fused attention': dict(kernels='xla+fused_attention'),
    'cpu forms': dict(kernels='cpu'),
}


def bench_forms(size: dict, peak: float, out: str | None, forms: list[str],
                decode_forms: list[str], profiled: dict) -> list[dict]:
  """The base bf16 train step with each of `forms` (of FORMS; compiled together, timed one
  by one), then the beam search with each of `decode_forms` at every sentence count. The
  compiled 'xla' step is left in `profiled['step']` for the profile part."""
  lines, prepared, t0 = [], [], time.perf_counter()
  for form in forms:
    try:
      prepared.append((form, *prepare_train('base', size, 'bfloat16', FORMS[form])))
    except Exception as e:  # a form this backend cannot lower is reported
      lines.append(failed('forms', form, e, out))
    progress(f'forms: {form} lowered', t0)
  compiled, compile_s = compile_all([p[2] for p in prepared])
  progress('forms: compiled', t0)
  timed_forms = []
  for (form, fields, _, state, batch), step, seconds in zip(prepared, compiled, compile_s,
                                                            strict=True):
    if isinstance(step, Exception):
      lines.append(failed('forms', form, step, out))
      continue
    step_s, state = time_steps(step, state, batch, size['steps'])
    if form == 'xla':
      profiled['step'] = step, state, batch  # the profile part traces this one
    timed_forms.append((form, fields, step_s * 1e3, seconds))
  xla_ms = {form: ms for form, _, ms, _ in timed_forms}.get('xla')
  for form, fields, ms, seconds in timed_forms:
    lines.append(emit({'part': 'forms', 'form': form, 'config': 'base', 'dtype': 'bfloat16',
                       'batch': fields['batch'], 'ms': round(ms, 2),
                       'vs_xla': round(ms / xla_ms, 3) if xla_ms else None,
                       'fraction_of_peak': round(fields['flops'] / ms * 1e3 / peak, 3)
                       if peak else None, 'compile_s_parallel': round(seconds, 1)}, out))
  return lines + bench_decode_forms(size, out, decode_forms)


def bench_decode_forms(size: dict, out: str | None, forms: list[str]) -> list[dict]:
  """Base bf16 beam-4 search with each of `forms` (of DECODE_FORMS) at each sentence count,
  over one set of parameters (ModelConfig's fields are config.model's keys)."""
  mesh, t0 = mesh_lib.make_mesh(), time.perf_counter()
  f32, params = decode_params(size, mesh)
  lines, prepared = [], []
  for form in forms:
    for rows in size['sentences']:
      c = f32.replace(dtype='bfloat16', **DECODE_FORMS[form])
      prepared.append((form, rows, *prepare_search(c, size, rows, mesh, params)))
  progress('decode forms: lowered', t0)
  compiled, compile_s = compile_all([p[2] for p in prepared])
  progress('decode forms: compiled', t0)
  results = []
  for (form, rows, _, args), search, seconds in zip(prepared, compiled, compile_s, strict=True):
    if isinstance(search, Exception):
      lines.append(failed('decode_forms', form, search, out))
      continue
    results.append((form, rows, *time_search(search, args), seconds))
  xla_ids = {rows: ids for form, rows, _, ids, _ in results if form == 'xla'}
  for form, rows, search_s, ids, seconds in results:
    same = (ids == xla_ids[rows]).all(axis=-1).mean() if rows in xla_ids else None
    lines.append(emit({'part': 'decode_forms', 'form': form, 'sentences': rows,
                       'ms': round(search_s * 1e3, 1), 'sentences_per_s': round(rows / search_s, 1),
                       'ids_equal_xla_share': None if same is None else round(float(same), 3),
                       'compile_s_parallel': round(seconds, 1)}, out))
  return lines
