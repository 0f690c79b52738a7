"""finetune package of sesame-lm."""
