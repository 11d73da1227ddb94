"""What a trained run is used for: the Translator (the Python API), evaluation (§6.1's
BLEU), attention maps and the Hugging Face export. Over `run`."""
