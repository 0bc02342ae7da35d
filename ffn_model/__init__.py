"""The Flax NNX FFN stack (scanned blocks), its sharded train step, abstract compile and CLI."""
