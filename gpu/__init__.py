"""What runs on the gpu queue: video backends, model residency, quality phases, training."""
