"""pretrain package of sesame-lm."""
