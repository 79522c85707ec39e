"""The Qwen3.5/3.6 model family in Python: config, checkpoints, tokenizer, chat format,
the fp32 numpy reference forward, synthetic checkpoints and weight formats."""
