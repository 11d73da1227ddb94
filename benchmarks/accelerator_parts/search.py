"""The decode part: base beam-4 search over random sentences in bf16 and float32, the share of
the same outputs, and bf16 at each sentence count of the sweep."""
from __future__ import annotations

import time

from accelerator_parts.shared import decode_params, emit, prepare_search, time_search
from t2t_jax.platform import mesh as mesh_lib


def bench_decode(size: dict, out: str | None, dtypes: list[str]) -> list[dict]:
  """Base beam-4 decoding at each sentence count in bf16, and the first count in float32
  (with float32 in `dtypes`), then the share of the same outputs."""
  mesh = mesh_lib.make_mesh()
  f32, params = decode_params(size, mesh)
  lines, outputs = [], {}
  runs = [('bfloat16', n) for n in size['sentences']]
  if 'float32' in dtypes:
    runs.append(('float32', size['sentences'][0]))
  for dtype, rows in runs:
    c = f32.replace(dtype=dtype)
    t0 = time.perf_counter()
    lowered, args = prepare_search(c, size, rows, mesh, params)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    seconds, ids = time_search(compiled, args)
    outputs[dtype, rows] = ids
    lines.append(emit({'part': 'decode', 'config': 'base', 'dtype': dtype, 'kernels': c.kernels,
                       'sentences': rows,
                       'source_length': size['source_length'], 'beam': 4,
                       'max_steps': size['source_length'] + size['extra_length'],
                       'ms': round(seconds * 1e3, 1),
                       'sentences_per_s': round(rows / seconds, 1),
                       'output_tokens': int((ids != 0).sum()),
                       'compile_s': round(compile_s, 1)}, out))
  for rows in size['sweep']:  # config.decode_tokens_per_batch=0's per-platform value
    lowered, args = prepare_search(f32.replace(dtype='bfloat16'), size, rows, mesh, params)
    seconds, _ = time_search(lowered.compile(), args)
    lines.append(emit({'part': 'decode_sweep', 'dtype': 'bfloat16', 'sentences': rows,
                       'padded_source_tokens': rows * size['source_length'],
                       'sentences_per_s': round(rows / seconds, 1)}, out))
  first = size['sentences'][0]
  if ('float32', first) not in outputs:
    return lines
  same = (outputs['bfloat16', first] == outputs['float32', first]).all(axis=-1)
  lines.append(emit({'part': 'decode_agreement', 'sentences': first,
                     'bf16_ids_equal_float32_share': round(float(same.mean()), 3),
                     'weights': 'random'}, out))
  return lines
