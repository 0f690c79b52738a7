"""The shipped `squad` evaluate metric module (load it with `finetune.metrics.load_metric("squad")`)."""
