"""finetune/metrics package of sesame-lm."""
