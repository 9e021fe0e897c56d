"""A real multi-process cluster on one machine: its shape (config.yaml), its processes and
network, and the `python -m deploy.launch` command."""
