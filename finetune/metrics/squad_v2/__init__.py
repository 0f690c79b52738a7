"""The shipped `squad_v2` evaluate metric module (load it with `finetune.metrics.load_metric("squad_v2")`)."""
