"""Model definitions and checkpoint loaders (Llama family)."""
