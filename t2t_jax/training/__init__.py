"""§5: label-smoothed loss, Adam with the warm-up schedule, the data-parallel train step and
its compilation ahead of time, checkpoints and §6.1's averaging. Over `model`."""
