"""§6.1: beam search, sampling and BLEU, and the batch plan that runs a search over many
sentences on every device. Over `model`; beside `training`, which it never imports."""
