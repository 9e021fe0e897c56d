"""The trained model answering requests, with no Vertex AI account needed: `signature` (the
SavedModel's inputs, read without TensorFlow), `instances` (Vertex's instance format checked
against them, and the `Predictor` that runs the model), `explain` (sampled Shapley attributions
from the exported baseline row), `batching` (requests that arrive together predicted in one
model call), `server` (the aiohttp server with Vertex's custom-container routes)."""
