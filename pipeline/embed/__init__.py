"""The frozen backbone between collection and routing: the sentence encoder (backbone.py: pooling, batching, the
embedding cache), its fast CPU backends (fast_backbone.py: OpenVINO / ONNX Runtime), the static Model2Vec backbone
(static_backbone.py) and where bundled model files are found (model_files.py)."""
