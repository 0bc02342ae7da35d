"""The model families' closed forms (the FFN stack, the transformer, the MoE transformer) and the presets built from
them."""
