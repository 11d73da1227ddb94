"""§5: label-smoothed loss, Adam with the warm-up schedule, the data-parallel train step and
its checkpoints. Over `model`; beside `decoding`, which it never imports."""
