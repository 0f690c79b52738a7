"""tokenizer package of sesame-lm."""
