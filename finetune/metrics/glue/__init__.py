"""The shipped `glue` evaluate metric module (load it with `finetune.metrics.load_metric("glue")`)."""
