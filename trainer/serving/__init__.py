"""The exported model: a SavedModel that Vertex AI's prebuilt containers serve, one search's
or a bagged job's."""
