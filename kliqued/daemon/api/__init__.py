"""api room (see README.md)."""
