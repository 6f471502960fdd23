"""Client side of ragstack: the Python client API, the CLI and the launcher of the real Triton server."""
