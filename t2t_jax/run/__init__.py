"""A trained run, the one home of what it is: its recorded config, the parameters a mode
decodes with (a checkpoint, the best one or §6.1's average), its vocabulary's fingerprint,
the run a fine-tuning starts from (init_from) and the runs decoded with it (an ensemble).
Over `decoding` and `training`."""
