"""training package of sesame-lm."""
