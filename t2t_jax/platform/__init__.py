"""Plumbing, no paper: errors, logs, crash-safe files, XLA and huge-page set-up, the device
mesh, several processes, the workdir and its metrics. Imports nothing else of t2t_jax."""
