"""fleet room (see README.md)."""
