"""AdaNet-style ensembles of neural networks, TensorFlow 2 native, for Vertex AI."""
