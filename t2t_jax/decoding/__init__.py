"""§6.1: beam search, the Translator, BLEU, evaluation, attention maps and the Hugging Face
export. Over `training` (its checkpoints)."""
