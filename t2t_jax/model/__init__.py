"""§3's Transformer (`transformer`), the key/value cache it decodes with (`cache`), and the one
seam for backend-specific ways of computing the same thing (`kernels`). Over `data` (its token
ids) and `platform`."""
