"""What a training run reports beyond its loss: where a step's time goes, throughput and MFU,
and the sinks besides metrics.jsonl (TensorBoard, a Prometheus textfile)."""
