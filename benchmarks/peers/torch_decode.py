"""PyTorch peer of benchmarks/decode.py: beam search with a growing key/value cache.

  python benchmarks/peers/torch_decode.py [--config base] [--sentences 64] [--repeats 3]

What it is: the same beam-search benchmark as benchmarks/decode.py (§6.1 settings: beam 4,
GNMT length penalty ((5 + |Y|) / 6)^0.6, outputs up to input length + 50), written the way
fast eager PyTorch CPU inference is written (fairseq, Hugging Face `generate`), so that our
JAX numbers have a fair outside reference. Of this repository it takes only the configs'
model sizes and benchmarks/decode.py's inputs (benchmarks/common.py): nothing of t2t_jax's
model or decoding, and not JAX. tests/test_benchmarks.py loads t2t_jax's weights into it at
a tiny size and checks its logits, its cached steps and its beam and greedy outputs against
t2t_jax's.

How it's built:
  * the Transformer of the paper (post-LN encoder-decoder; --config's sizes, base:
    vocabulary 37000, d_model 512, 8 heads, d_ff 2048, 6 + 6 layers; one shared embedding,
    × √d_model on input and tied as the pre-softmax projection; interleaved sinusoidal
    positions; no biases in the attention projections, biases in the FFN; LayerNorm
    ε = 1e-6), random weights from torch.manual_seed(0), float32, torch.inference_mode(),
    torch.set_num_threads(cpu_count);
  * torch's fused kernels: one F.linear for the self-attention Q, K, V (and one for the
    cross-attention K, V), F.scaled_dot_product_attention, F.layer_norm;
  * the encoder runs once; the cross-attention keys/values are projected once per sentence
    and shared by its k beams: the k beams' queries are that sentence's k query rows
    against its [h, s, d] keys (a broadcast, no per-beam copy);
  * the self-attention keys/values of each layer are a [b·k, h, t, d] tensor, grown by
    torch.cat each step and reordered by index_select with the surviving beams' parents
    (the standard growing cache of fairseq's and Hugging Face's `reorder_cache`);
  * each step: log_softmax over the vocabulary (padding id 0 banned, only EOS at the length
    limit), top-2k over beam × vocabulary (top-1 for beam 1: exactly greedy), the best k
    non-EOS candidates stay live, EOS candidates are scored log P / lp(|Y|) (|Y| counting
    EOS) and the best finished hypothesis of each sentence is kept;
  * all sentences × beams in one batch; early stopping off: random weights never reliably
    emit EOS, so every sentence runs to its limit, input + 50 = 82 steps, as in
    benchmarks/decode.py (same inputs: common.random_sources, numpy default_rng(0)).

Output: one JSON line with benchmark/decode.py's keys (peer instead of cache); seconds is the
median of --repeats runs after one warm-up. `bench(args)` returns that dict for other scripts;
`build_model` and `beam_search` are importable too.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import common  # benchmarks/common.py: the configs' sizes; no JAX

PAD_ID = 0  # padding, and the decoder's start symbol
EOS_ID = common.EOS_ID
LN_EPS = 1e-6


def sinusoids(length: int, d_model: int) -> Tensor:
  """[length, d_model]: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)."""
  two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
  angles = torch.arange(length, dtype=torch.float32)[:, None] / (10000.0 ** (two_i / d_model))
  return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(length, -1)[:, :d_model]


class SelfAttention(nn.Module):
  """Multi-head self-attention with one fused Q/K/V projection and no biases."""

  def __init__(self, d_model: int, num_heads: int):
    super().__init__()
    self.h, self.d = num_heads, d_model // num_heads
    self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
    self.out = nn.Linear(d_model, d_model, bias=False)

  def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
    """Whole sequences, x [b, t, m]; mask [b, 1, 1, t] (True = attend) or None."""
    b, t, m = x.shape
    q, k, v = self.qkv(x).view(b, t, 3, self.h, self.d).permute(2, 0, 3, 1, 4)  # [b, h, t, d]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return self.out(o.transpose(1, 2).reshape(b, t, m))

  def step(self, x: Tensor, cache: tuple[Tensor, Tensor] | None
           ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One position of each row, x [n, m]; cache ([n, h, t, d] keys, values) or None.
    Returns the output [n, m] and the cache grown by this position (torch.cat)."""
    n, m = x.shape
    qkv = self.qkv(x).view(n, 3, self.h, 1, self.d)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # [n, h, 1, d]
    if cache is not None:
      k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    o = F.scaled_dot_product_attention(q, k, v)  # every cached position is visible
    return self.out(o.reshape(n, m)), (k, v)


class CrossAttention(nn.Module):
  """Encoder-decoder attention: queries from the decoder, fused K/V of the encoder output."""

  def __init__(self, d_model: int, num_heads: int):
    super().__init__()
    self.h, self.d = num_heads, d_model // num_heads
    self.q = nn.Linear(d_model, d_model, bias=False)
    self.kv = nn.Linear(d_model, 2 * d_model, bias=False)
    self.out = nn.Linear(d_model, d_model, bias=False)

  def project(self, memory: Tensor) -> tuple[Tensor, Tensor]:
    """Encoder output [b, s, m] -> keys, values [b, h, s, d], once per sentence."""
    b, s, _ = memory.shape
    k, v = self.kv(memory).view(b, s, 2, self.h, self.d).permute(2, 0, 3, 1, 4)
    return k.contiguous(), v.contiguous()

  def forward(self, x: Tensor, kv: tuple[Tensor, Tensor], mask: Tensor | None) -> Tensor:
    """x [b, q, m]: q query rows per sentence (its positions, or its k beams at one step)."""
    b, q, m = x.shape
    query = self.q(x).view(b, q, self.h, self.d).transpose(1, 2)  # [b, h, q, d]
    o = F.scaled_dot_product_attention(query, kv[0], kv[1], attn_mask=mask)
    return self.out(o.transpose(1, 2).reshape(b, q, m))


class FeedForward(nn.Module):
  def __init__(self, d_model: int, d_ff: int):
    super().__init__()
    self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

  def forward(self, x: Tensor) -> Tensor:
    return self.w_2(F.relu(self.w_1(x)))


class EncoderLayer(nn.Module):
  def __init__(self, d_model: int, num_heads: int, d_ff: int):
    super().__init__()
    self.attn, self.ffn = SelfAttention(d_model, num_heads), FeedForward(d_model, d_ff)
    self.ln_1, self.ln_2 = nn.LayerNorm(d_model, LN_EPS), nn.LayerNorm(d_model, LN_EPS)

  def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
    x = self.ln_1(x + self.attn(x, mask))
    return self.ln_2(x + self.ffn(x))


class DecoderLayer(nn.Module):
  def __init__(self, d_model: int, num_heads: int, d_ff: int):
    super().__init__()
    self.self_attn = SelfAttention(d_model, num_heads)
    self.cross_attn = CrossAttention(d_model, num_heads)
    self.ffn = FeedForward(d_model, d_ff)
    self.ln_1, self.ln_2, self.ln_3 = (nn.LayerNorm(d_model, LN_EPS) for _ in range(3))

  def forward(self, y: Tensor, kv: tuple[Tensor, Tensor], mask: Tensor | None) -> Tensor:
    """Teacher-forced, whole target sequences y [b, t, m] (causal self-attention)."""
    y = self.ln_1(y + self.self_attn(y, causal=True))
    y = self.ln_2(y + self.cross_attn(y, kv, mask))
    return self.ln_3(y + self.ffn(y))

  def step(self, y: Tensor, cache: tuple[Tensor, Tensor] | None, kv: tuple[Tensor, Tensor],
           mask: Tensor | None, beam: int) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One position of each of b·k hypotheses, y [b·k, m] (a sentence's k beams adjacent)."""
    n, m = y.shape
    a, cache = self.self_attn.step(y, cache)
    y = self.ln_1(y + a)
    y = self.ln_2(y + self.cross_attn(y.view(n // beam, beam, m), kv, mask).view(n, m))
    return self.ln_3(y + self.ffn(y)), cache


class Transformer(nn.Module):
  """The post-LN encoder-decoder of the paper, with a shared, tied embedding (§3.4)."""

  def __init__(self, vocab_size: int, d_model: int, num_heads: int, d_ff: int,
               num_layers: int, max_positions: int = 1024):
    super().__init__()
    self.d_model = d_model
    self.embedding = nn.Parameter(torch.randn(vocab_size, d_model) * d_model ** -0.5)
    self.register_buffer('positions', sinusoids(max_positions, d_model), persistent=False)
    self.encoder = nn.ModuleList(
        EncoderLayer(d_model, num_heads, d_ff) for _ in range(num_layers))
    self.decoder = nn.ModuleList(
        DecoderLayer(d_model, num_heads, d_ff) for _ in range(num_layers))
    for name, p in self.named_parameters():
      if p.dim() == 2 and name != 'embedding':
        nn.init.xavier_uniform_(p)

  def embed(self, ids: Tensor, positions: Tensor | slice) -> Tensor:
    return F.embedding(ids, self.embedding) * math.sqrt(self.d_model) + self.positions[positions]

  def logits(self, x: Tensor) -> Tensor:
    return F.linear(x, self.embedding)  # the embedding is the pre-softmax projection

  def encode(self, src: Tensor) -> tuple[list[tuple[Tensor, Tensor]], Tensor | None]:
    """src [b, s] -> each decoder layer's cross-attention keys/values and the source mask
    ([b, 1, 1, s], True = a real token; None when there is no padding: SDPA's fast path)."""
    mask = (src != PAD_ID)[:, None, None, :]
    mask = None if bool(mask.all()) else mask
    x = self.embed(src, slice(0, src.shape[1]))
    for layer in self.encoder:
      x = layer(x, mask)
    return [layer.cross_attn.project(x) for layer in self.decoder], mask

  def decode_full(self, tgt_in: Tensor, memory_kv: list[tuple[Tensor, Tensor]],
                  mask: Tensor | None) -> Tensor:
    """No cache: the decoder over whole inputs tgt_in [b, t] (start symbol first) ->
    logits [b, t, v]. The reference that the cached steps are checked against."""
    y = self.embed(tgt_in, slice(0, tgt_in.shape[1]))
    for layer, kv in zip(self.decoder, memory_kv, strict=True):
      y = layer(y, kv, mask)
    return self.logits(y)

  def decode_step(self, ids: Tensor, step: int, caches: list, memory_kv: list,
                  mask: Tensor | None, beam: int) -> tuple[Tensor, list]:
    """ids [b·k] (each hypothesis's last token, at position `step`) -> logits [b·k, v] and
    the caches grown by one position."""
    y = self.embed(ids, step)
    new_caches = []
    for layer, cache, kv in zip(self.decoder, caches, memory_kv, strict=True):
      y, cache = layer.step(y, cache, kv, mask, beam)
      new_caches.append(cache)
    return self.logits(y), new_caches


def build_model(config: str | dict = 'base', seed: int = 0) -> Transformer:
  """Random weights from torch.manual_seed(seed), float32, in eval mode; `config` a name of
  common.CONFIGS or model_dims-like sizes."""
  torch.manual_seed(seed)
  kwargs = common.model_dims(config) if isinstance(config, str) else config
  return Transformer(**kwargs).eval()


def length_penalty(length: int, alpha: float) -> float:
  """GNMT: lp(Y) = ((5 + |Y|) / 6)^α."""
  return ((5.0 + length) / 6.0) ** alpha


@torch.inference_mode()
def beam_search(model: Transformer, src: Tensor, beam: int = 4, extra_length: int = 50,
                alpha: float = 0.6) -> tuple[Tensor, Tensor]:
  """src [b, s] int64 -> the best finished hypothesis of each sentence, ids [b, T] (ending
  in EOS, then 0s; T = s + extra_length) and its score log P / lp [b].

  Each sentence's limit is its non-padding tokens + extra_length; no early stopping: the
  loop always runs T steps (as benchmarks/decode.py's early_stop=False).
  """
  b, s = src.shape
  k, steps = beam, s + extra_length
  n = b * k
  # |Y| ≤ limit, EOS included: the non-padding input tokens + extra; 1 (only EOS) for a row
  # without words (all padding, or only EOS), as t2t_jax.decoding.decode.output_limits.
  words = ((src != PAD_ID) & (src != EOS_ID)).sum(1)
  limits = torch.where(words == 0, 1, (src != PAD_ID).sum(1) + extra_length)  # [b]
  min_limit = int(limits.min())
  memory_kv, mask = model.encode(src)
  # The k beams of a sentence share its keys/values: CrossAttention broadcasts them.
  candidates = 1 if k == 1 else 2 * k  # beam 1 takes one candidate a step: greedy
  live_logp = torch.full((b, k), -math.inf)
  live_logp[:, 0] = 0.0  # one live hypothesis at first: the start symbol
  live_seqs = torch.full((n, 1), PAD_ID, dtype=torch.long)
  finished_seq = torch.zeros((b, steps + 1), dtype=torch.long)
  finished_score = torch.full((b,), -math.inf)
  caches: list = [None] * len(model.decoder)
  rows = torch.arange(b)
  base = (rows * k)[:, None]  # [b, 1] the flat index of each sentence's first beam
  for t in range(steps):
    logits, caches = model.decode_step(live_seqs[:, -1], t, caches, memory_kv, mask, k)
    logp = torch.log_softmax(logits, dim=-1).view(b, k, -1)  # [b, k, v]
    logp[:, :, PAD_ID] = -math.inf  # 0 inside an output would read as its end
    if t + 1 >= min_limit:  # at a sentence's limit only EOS may follow; past it nothing
      eos = torch.where((t + 1 > limits)[:, None], -math.inf, logp[:, :, EOS_ID])
      logp.masked_fill_((t + 1 >= limits)[:, None, None], -math.inf)
      logp[:, :, EOS_ID] = eos
    vocab = logp.shape[-1]
    scores = (logp + live_logp[:, :, None]).view(b, k * vocab)
    top_scores, top_index = scores.topk(candidates, dim=1)  # [b, c], best first
    parents, tokens = top_index // vocab, top_index % vocab
    is_eos = tokens == EOS_ID
    # Finished: the best EOS candidate of each sentence against its best so far.
    done = torch.where(is_eos, top_scores, -math.inf) / length_penalty(t + 1, alpha)
    best_done, which = done.max(dim=1)
    better = best_done > finished_score
    if bool(better.any()):
      parent = base[:, 0] + parents[rows, which]
      seq = torch.cat([live_seqs[parent], torch.full((b, 1), EOS_ID, dtype=torch.long)], 1)
      finished_seq[:, :t + 2] = torch.where(better[:, None], seq, finished_seq[:, :t + 2])
      finished_score = torch.where(better, best_done, finished_score)
    # Live: the best k candidates that do not end in EOS (at most k of the 2k do).
    live_logp, keep = torch.where(is_eos, -math.inf, top_scores).topk(k, dim=1)  # [b, k]
    origin = (base + parents.gather(1, keep)).view(n)  # each new beam's parent row
    live_seqs = torch.cat([live_seqs.index_select(0, origin),
                           tokens.gather(1, keep).view(n, 1)], dim=1)
    caches = [(c[0].index_select(0, origin), c[1].index_select(0, origin)) for c in caches]
  return finished_seq[:, 1:], finished_score


def bench(args: argparse.Namespace) -> dict:
  """One warm-up, then the median of `args.repeats` timed searches; the JSON line's dict."""
  torch.set_num_threads(os.cpu_count())
  model = build_model(args.config)
  src = torch.from_numpy(common.random_sources(
      args.sentences, args.length, common.model_dims(args.config)['vocab_size'])).long()
  run = lambda: beam_search(model, src, args.beam, args.extra_length, alpha=0.6)  # noqa: E731
  run()  # warm-up
  load = os.getloadavg()[0]  # other processes share the CPU: a high load means slower runs
  walls, cpus = [], []
  for _ in range(args.repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    ids, _ = run()
    walls.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
  wall = statistics.median(walls)
  rows, steps = src.shape[0], src.shape[1] + args.extra_length
  return {'benchmark': 'decode', 'peer': 'pytorch_growing_kv_cache', 'config': args.config,
          'sentences': rows, 'input_tokens': src.shape[1], 'beam_size': args.beam,
          'steps': steps, 'early_stop': False, 'seconds': round(wall, 3),
          'sentences_per_s': round(rows / wall, 3),
          'output_tokens_per_s': round(rows * steps / wall, 1),
          'best_output_tokens': int((ids != PAD_ID).sum()),
          'cpu_seconds_per_wall_second': round(statistics.median(cpus) / wall, 2),
          'load_average_1min': round(load, 2), 'cpu_count': os.cpu_count(),
          'torch': torch.__version__, 'threads': torch.get_num_threads()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='base', choices=sorted(common.CONFIGS))
  parser.add_argument('--sentences', type=int, default=64)
  parser.add_argument('--length', type=int, default=32)
  parser.add_argument('--beam', type=int, default=4)
  parser.add_argument('--extra-length', type=int, default=50)
  parser.add_argument('--repeats', type=int, default=5)
  return parser.parse_args(argv)


if __name__ == '__main__':
  common.emit(bench(parse_args()))
