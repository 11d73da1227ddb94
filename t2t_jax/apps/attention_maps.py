"""Attention heatmaps (`--mode=attention`) like the paper's appendix (Figures 3-5): one PNG per
layer and attention kind, one panel per head, of the model run teacher-forced on a sentence and
its translation (beam search, §6.1) with the weights MultiHeadAttention sows."""
from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from t2t_jax.apps.translator import Translator
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import errors, files

KINDS = {  # sown name -> (title, the queries' labels, the keys')
    'encoder_self_attention': ('encoder self-attention', 'source', 'source'),
    'decoder_self_attention': ('decoder self-attention', 'decoder input', 'decoder input'),
    'decoder_cross_attention': ('encoder-decoder attention', 'decoder input', 'source'),
}


def attention_weights(params: Any, model_config: ModelConfig, src: Sequence[int],
                      tgt: Sequence[int]) -> dict[tuple[str, int], np.ndarray]:
  """{(kind, layer): weights [heads, queries, keys]} for one teacher-forced pair."""
  model = Transformer(model_config.replace(deterministic=True))
  _, state = model.apply({'params': params}, np.asarray([src], np.int32),
                         np.asarray([tgt], np.int32), mutable=['intermediates'])
  found = {}
  for path, value in jax.tree_util.tree_flatten_with_path(state['intermediates'])[0]:
    names = [getattr(p, 'key', None) for p in path]
    stack = 'encoder' if 'encoder' in names else 'decoder'
    layer = int(next(n for n in names if isinstance(n, str) and n.startswith('layer_'))[6:])
    kind = 'cross_attention' if 'cross_attention' in names else 'self_attention'
    found[(f'{stack}_{kind}', layer)] = np.asarray(value)[0]  # [h, q, k]
  return found


@dataclasses.dataclass(frozen=True)
class Attended:
  """A sentence, its translation, and the model's attention over the pair."""
  translation: str
  weights: dict[tuple[str, int], np.ndarray]  # attention_weights'
  labels: dict[str, list[str]]  # 'source' and 'decoder input': each position's sub-word


def translate_and_attend(translator: Translator, sentence: str) -> Attended:
  """Translates `sentence` (the run's search), then runs the model teacher-forced on the pair."""
  translation = translator([sentence])[0]
  tokenizer = translator.tokenizer
  src, tgt = tokenizer.encode(sentence), tokenizer.encode(translation)
  # The decoder's query at position i reads target i-1 (shifted right, start symbol first).
  labels = {'source': tokenizer.pieces(src), 'decoder input': ['<s>', *tokenizer.pieces(tgt)[:-1]]}
  return Attended(translation, attention_weights(translator.params, translator.model_config,
                                                 src, tgt), labels)


def plot(weights: np.ndarray, query_labels: Sequence[str], key_labels: Sequence[str],
         title: str, path: str) -> None:
  """figure_png's picture into `path`."""
  png = figure_png(weights, query_labels, key_labels, title)
  # Into a new file beside `path`, then renamed over it: never written through a link there.
  tmp = f'{path}.tmp-{os.getpid()}.png'
  with files.open_file(tmp, 'xb', 'an attention map') as f:
    f.write(png)
  os.replace(tmp, path)


def figure_png(weights: np.ndarray, query_labels: Sequence[str], key_labels: Sequence[str],
               title: str) -> bytes:
  """One panel per head: rows are queries, columns keys, darker = more attention; a PNG."""
  import matplotlib  # noqa: PLC0415 (only attention maps draw: importing it is slow)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # noqa: PLC0415 (after use('Agg'): no display needed)
  heads = weights.shape[0]
  cols = min(heads, 4)
  rows = -(-heads // cols)
  size = 0.28 * max(len(query_labels), len(key_labels)) + 1.5
  fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size), squeeze=False)
  for h, ax in enumerate(axes.flat):
    if h >= heads:
      ax.axis('off')
      continue
    ax.imshow(weights[h], cmap='Greys', vmin=0.0, vmax=1.0)
    ax.set_title(f'head {h}', fontsize=9)
    ax.set_xticks(range(len(key_labels)), key_labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(query_labels)), query_labels, fontsize=7)
  fig.suptitle(title)
  fig.tight_layout()
  buffer = io.BytesIO()
  fig.savefig(buffer, dpi=100, format='png')
  plt.close(fig)
  return buffer.getvalue()


def chosen_layers(layers: Sequence[int | str] | None, num_layers: int) -> list[int]:
  """--layers as layer numbers (default: all), each a layer of the model."""
  if not layers:
    return list(range(num_layers))
  chosen = []
  for layer in layers:
    try:
      chosen.append(int(layer))
    except ValueError:
      raise errors.UserError(f'--layers={",".join(map(str, layers))}: layer numbers from 0, '
                             'e.g. --layers=0,5') from None
    if not 0 <= chosen[-1] < num_layers:
      raise errors.UserError(f'--layers: layer {layer} does not exist (the model has '
                             f'{num_layers})')
  return chosen


def draw(config: ml_collections.ConfigDict, workdir: str, sentence: str, out_dir: str | None,
         layers: Sequence[int | str] | None = None) -> list[str]:
  """Translates `sentence`, then writes the heatmaps of `layers` (default: all)."""
  if config.ensemble:  # the heatmaps are of one model's attention
    raise errors.UserError(f'config.ensemble={config.ensemble!r}: --mode=attention plots the '
                           "workdir's model alone; drop the ensemble")
  chosen = chosen_layers(layers, config.model.num_layers)  # before any work
  if out_dir is None:
    out_dir = files.writable_folder(os.path.join(workdir, 'attention'), workdir,
                                    'attention maps')
  else:
    with files.disk_write_errors(out_dir, 'attention maps'):
      os.makedirs(out_dir, exist_ok=True)
    files.writable_folder(out_dir, out_dir, 'attention maps')
  translator = Translator(config, workdir, mode='attention')
  found = translate_and_attend(translator, sentence)
  paths = []
  for (kind, layer), w in sorted(found.weights.items()):
    if layer in chosen:
      title, queries, keys = KINDS[kind]
      path = os.path.join(out_dir, f'{kind}_layer{layer}.png')
      plot(w, found.labels[queries], found.labels[keys],
           f'{title}, layer {layer}\n{sentence!r} -> {found.translation!r}', path)
      paths.append(path)
  return paths
