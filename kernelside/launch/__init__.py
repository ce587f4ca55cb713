"""Kernel side: a launch request becomes a plan, runs on one engine, and its recorder decides the outcome."""
