"""The experiment config: every key's rule, the checks against a run's recorded config, and
the command line's hints. Over `platform`."""
