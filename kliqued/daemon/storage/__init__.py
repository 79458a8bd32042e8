"""storage room (see README.md)."""
