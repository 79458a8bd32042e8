"""Route handlers, one module per resource of the API. Each checks who may call it (the
principal is set by the auth middleware), reads the live state through ``views`` and sends
changes through the sequencer."""
