"""The input pipeline: files found and checked, a streaming statistics pass, and the tf.data
datasets that training, evaluation and prediction read."""
