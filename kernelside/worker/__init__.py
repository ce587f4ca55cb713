"""Code that runs inside the worker processes: the rank's life cycle, its context, progress and results."""
