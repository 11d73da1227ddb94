"""§5.1's data: the shared SentencePiece vocabulary, the sources (tfds WMT14, text files, the
demo corpus, a synthetic task), the encoded id cache and length-bucketed batches
(`pipeline` puts them together). Over `config` and `platform`."""
