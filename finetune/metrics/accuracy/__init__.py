"""The shipped `accuracy` evaluate metric module (load it with `finetune.metrics.load_metric("accuracy")`)."""
