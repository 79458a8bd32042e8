"""state room (see README.md)."""
