"""ha room (see README.md)."""
