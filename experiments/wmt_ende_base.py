"""Transformer (base) on WMT14 English→German: Table 3, row "base".

Vaswani et al., "Attention Is All You Need", 2017. Every number taken from the
paper carries its section. Override any key from the command line, e.g.
`--config.model.num_heads=1` for Table 3 row (A).
"""
import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()

  # ----- Data (§5.1) -----
  config.dataset = 'tfds'  # 'tfds' | 'files' | 'synthetic'
  config.tfds_name = 'wmt14_translate/de-en'  # tfds stores the pair German first
  config.tfds_data_dir = ''  # '' = the tfds default (~/tensorflow_datasets)
  config.tfds_manual_dir = ''  # folder with manually downloaded WMT archives
  config.source_lang = 'en'  # EN→DE, §6.1
  config.target_lang = 'de'  # the language translated into
  config.train_split = 'train'  # the tfds split trained on
  config.dev_split = 'validation'  # newstest2013, §6.2
  config.test_split = 'test'  # newstest2014, §6.1
  # dataset='files': PREFIX, reading PREFIX.<source_lang> and PREFIX.<target_lang>
  config.train_files = ''
  config.dev_files = ''  # dataset='files': the dev set's PREFIX (newstest2013's role)
  config.test_files = ''  # dataset='files': the test set's PREFIX (--mode=eval)
  config.vocab_size = 37000  # shared source-target BPE vocabulary, §5.1
  config.vocab_sample_sentences = 2_000_000  # sentences (both sides) to train SentencePiece on
  config.max_length = 256  # sub-word tokens per side; longer pairs are dropped (and counted)
  # §5.1: "approximately 25000 source tokens and 25000 target tokens" a batch. The key caps
  # padded slots a side (rows × padded length: what memory and compiled shapes depend on);
  # with these buckets 92.6% of slots hold real tokens (benchmarks/compilation.py on the WMT
  # sample), so 27000 slots carry ~25000 real tokens a side.
  config.tokens_per_batch = 27000
  config.eval_tokens_per_batch = 8192  # padded tokens a side per dev-loss batch
  # Padded lengths: multiples of 4 growing ~10% a bucket. The shorter side of a
  # pair sits at most `bucket_band` buckets below the longer one (0 = pad both to
  # the longer, as tensor2tensor): larger = less padding, more compiled shapes.
  config.bucket_growth = 1.1
  config.bucket_band = 2  # buckets the shorter side may sit below the longer
  # 'buckets' (§5.1, above) or 'packed': whole pairs side by side in rows of pack_length
  # tokens (the other side its share), each attending to itself alone (t2t_jax/data/
  # packing.py): one batch shape a run, so one compilation. 'auto': packed on GPU and TPU,
  # where the buckets' tens of shapes cost minutes of compiling, buckets on a CPU
  # (rules.batching_of). Rows of max_length tokens on the longer side: only pairs longer
  # than the other side's rows are left out (counted; one in ~10^4 on the WMT sample).
  config.batching = 'auto'
  config.pack_length = 256  # batching='packed': tokens a row, on the longer side

  # ----- Model (§3; Table 3 "base") -----
  config.model = ml_collections.ConfigDict()
  config.model.num_layers = 6  # N, §3.1
  config.model.d_model = 512  # §3.1
  config.model.d_ff = 2048  # §3.3
  config.model.num_heads = 8  # h, §3.2.2
  # d_k = d_v = d_model / h = 64 (§3.2.2) when unset; Table 3 row (B) sets d_k alone.
  config.model.d_k = config_dict.placeholder(int)
  config.model.d_v = config_dict.placeholder(int)  # unset: d_model / h (§3.2.2)
  config.model.dropout_rate = 0.1  # P_drop, §5.4
  config.model.positional = 'sinusoidal'  # §3.5; 'learned' is Table 3 row (E)
  config.model.max_len = 512  # longest position a learned embedding covers
  # Compute dtype: 'auto' = bfloat16 on GPU/TPU, float32 on CPU (rules.compute_dtype);
  # parameters, Adam moments, softmax, layer-norm statistics and the loss stay float32.
  config.model.dtype = 'auto'
  # Hardware forms (t2t_jax/model/kernels.py): 'auto' = the CPU forms on a CPU, the plain 'xla'
  # ones elsewhere; the same model either way.
  config.model.kernels = 'auto'

  # ----- Training (§5.2–§5.4) -----
  config.label_smoothing = 0.1  # ε_ls, §5.4
  config.num_train_steps = 100_000  # §5.2
  # > 0: also stop (checkpoint, evaluate) after this many minutes of training, counted over
  # the run's resumes as num_train_steps is (modes/train.py TrainingClock)
  config.train_minutes = 0.0
  config.warmup_steps = 4000  # §5.3
  config.adam_beta1 = 0.9  # §5.3
  config.adam_beta2 = 0.98  # §5.3
  config.adam_eps = 1e-9  # §5.3
  config.learning_rate_scale = 1.0  # multiplies d_model^-0.5 · min(...) (§5.3 is 1.0)
  # 'warmup_rsqrt' is §5.3's. Fine-tuning (init_from) needs no warm-up: 'rsqrt' starts at
  # learning_rate (0 = §5.3's peak) and decays as §5.3's does after its peak; 'constant'
  # keeps learning_rate (training/optim.py).
  config.lr_schedule = 'warmup_rsqrt'
  config.learning_rate = 0.0  # lr_schedule 'rsqrt' or 'constant': the rate at the first step
  # k > 1: each update sums the gradients of k micro-batches of every device's rows, one
  # after another: the paper's update of ~25k source + ~25k target tokens in all (§5.1),
  # spread over its 8 GPUs (§5.2), on fewer or smaller accelerators (activation memory of
  # one micro-batch), the same update as k = 1.
  config.grad_accum_steps = 1
  config.seed = 0  # parameters' initialisation, dropout and the data order
  config.log_every_steps = 100  # train loss, rate and ETA to the log and TensorBoard
  config.eval_every_steps = 1000  # dev loss and perplexity on newstest2013

  # ----- Decoding and BLEU (§6.1) -----
  config.beam_size = 4  # §6.1
  config.beam_alpha = 0.6  # length penalty α, §6.1
  # 'beam' (§6.1), 'greedy' (beam search with one beam, whatever beam_size) or 'sample':
  # each token drawn from softmax(logits / sample_temperature) over the sample_top_k
  # likeliest (0 = all), then over the fewest of those holding sample_top_p of the
  # probability (nucleus sampling, Holtzman et al. 2020; 1.0 = all), keyed by sample_seed and
  # the sentence's line (back-translation)
  config.decode_method = 'beam'
  config.sample_temperature = 1.0  # decode_method='sample': T (above)
  config.sample_top_k = 0  # decode_method='sample': the k likeliest only (0 = all)
  config.sample_top_p = 1.0  # decode_method='sample': nucleus p (1.0 = all)
  config.sample_seed = 0  # decode_method='sample': the draws' seed
  # Other runs of the same vocabulary decoded with this one as an ensemble, 'DIR[:STEP],...'
  # (their average if any, else their newest checkpoint): the mean of the models'
  # log-probabilities at each step. Not the paper's; '' = this run alone.
  config.ensemble = ''
  # The models' log-probabilities weighted by these, this run's first ('' = their mean).
  config.ensemble_weights = ''
  config.decode_extra_length = 50  # maximum output length = input length + 50, §6.1
  # padded source tokens per decoding batch; 0: per platform, 4096 on a CPU, 16384 on GPU
  # and TPU (rules.decode_tokens_of)
  config.decode_tokens_per_batch = 0
  # Decoding batches' padded source lengths double from one bucket to the next (4, 8, 16, ...,
  # max_decode_input_length), each with a fixed number of rows: a handful of batch shapes
  # (each a compilation of the search) whatever the text. The padding costs little: every
  # sentence's output limit is its own length + decode_extra_length.
  config.decode_bucket_growth = 2.0
  config.max_decode_input_length = 1024  # longer inputs are truncated, with a warning
  # --mode=export writes 'marian' (a Hugging Face MarianMT folder) or 'ctranslate2'
  # (CTranslate2 models, float32 and int8, for fast CPU inference); docs/export.md.
  config.export_format = 'marian'
  config.eval_split = 'test'  # --mode=eval scores newstest2014 (§6.1); 'dev' = newstest2013
  # > 0: also dev BLEU during training, a beam search of the dev set each time in the
  # search's fixed shapes (its cost: docs/performance.md, Decoding)
  config.eval_bleu_every_steps = 0
  # --mode=eval's metrics, each with sacreBLEU's signature, beside the paper's tokenized
  # BLEU: sacreBLEU's 'bleu' (its n-gram precisions, brevity penalty and length ratio too),
  # 'chrf' (chrF2) and 'ter'.
  config.eval_metrics = 'bleu,chrf,ter'
  # > 0: stop training after this many dev evaluations in a row without a better
  # early_stopping_metric; the paper trains a fixed number of steps (0 = off).
  config.early_stopping_patience = 0
  config.early_stopping_metric = 'dev_loss'  # or 'dev_bleu' (needs eval_bleu_every_steps)

  # ----- Checkpoints and averaging (§5.2, §6.1) -----
  # §6.1: checkpoints "written at 10-minute intervals", i.e. every 1500 steps at §5.2's 0.4 s
  # a step. Saved by steps, so that averaging the last 5 spans the same 6000 updates on any
  # hardware; by wall-clock time it would span a different number on every machine. A crash
  # loses at most 1500 steps (SIGTERM and SIGINT save first); --config.
  # checkpoint_every_minutes=10 adds time-based saves, which then join the averaged window.
  config.checkpoint_every_steps = 1500
  config.checkpoint_every_minutes = 0.0  # > 0: also save every this many minutes
  config.keep_checkpoints = 20  # enough to average the last 20 (big)
  # Besides those, the keep_best checkpoints of lowest dev loss (of those saved at steps
  # where training evaluated the dev set) are never deleted (0 = none).
  config.keep_best = 1
  config.average_last = 5  # §6.1: base averages the last 5 checkpoints
  config.average_allow_fewer = False  # True: average what exists (with a warning)
  # 'last' is §6.1's; 'best': the average_last checkpoints of lowest dev loss (those at steps
  # where training evaluated the dev set, config.eval_every_steps).
  config.average_select = 'last'
  # Compiled steps kept on disk for later runs, restarts, eval and translate ('' = off).
  config.compilation_cache_dir = '~/.cache/t2t_jax/xla'
  # Compile the train and dev-loss steps for every batch shape the epoch will meet in
  # background threads at start (t2t_jax/platform/ahead.py), so that stepping seldom waits for one,
  # and the search for every decoding batch shape of an eval or a translated file;
  # on machines of at least 4 cores (below, the step needs them all).
  config.compile_ahead = True
  # Which checkpoint a mode reads. restore_step: 0 = the newest; N = checkpoints/N (train
  # resumes from it and moves newer ones aside; average ends at it; decoding reads it).
  config.restore_step = 0
  config.restart = False  # True: train from step 0 although checkpoints/ holds steps (moved aside)
  # Fine-tuning: 'DIR' or 'DIR:STEP' starts a new run from another run's parameters (its
  # average if it has one, else its newest checkpoint; at STEP if given) and vocabulary, with
  # a fresh optimizer and schedule. Not the paper's; '' = from a random initialisation.
  config.init_from = ''
  # Parameters for eval/translate/attention: 'auto' = averaged/ if it exists, else the
  # latest checkpoint; 'averaged' or 'checkpoint' to choose; 'best' = the checkpoint of
  # lowest dev loss (of those at steps where training evaluated the dev set).
  config.decode_params = 'auto'
  return config
