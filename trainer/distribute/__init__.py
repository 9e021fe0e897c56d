"""Distribution: the cluster a replica belongs to (TF_CONFIG, Vertex AI's variables), the
tf.distribute runtime under it, train loops, servers, preemption, and a local cluster."""
