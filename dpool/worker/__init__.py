"""The worker process: runs one task at a time for its local scheduler."""
