"""Live sessions: ranks that stay up across cells (see session.py)."""
