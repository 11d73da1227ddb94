"""The markdown table benchmarks/accelerator.py prints after its JSON lines."""
from __future__ import annotations

WHAT = ('form', 'config', 'batching', 'dtype', 'shape', 'batch', 'sentences', 'cache', 'mode',
        'thread', 'kernel')
FIGURES = ('tflop_per_s', 'ms', 'target_tokens_per_s', 'tokens_per_s', 'fraction_of_peak',
           'padding_efficiency', 'vs_xla', 'search_ms', 'search_vs_xla', 'sentences_per_s',
           'ids_equal_xla_share', 'bf16_ids_equal_float32_share', 'busy_ms_per_step',
           'ms_per_step', 'calls_per_step', 'seconds', 'compile_s', 'process_s', 'sacrebleu',
           'error')


def table(lines: list[dict]) -> str:
  """The lines as one markdown table: part, what, the figure that matters."""
  rows = ['| part | what | figure |', '|---|---|---|']
  for line in lines:
    what = ' '.join(str(line[k]) for k in WHAT if k in line)
    figure = ', '.join(f'{k} {line[k]}' for k in FIGURES if line.get(k) is not None)
    rows.append(f"| {line['part']} | {what} | {figure} |")
  return '\n'.join(rows)
