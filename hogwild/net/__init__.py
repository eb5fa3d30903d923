"""Network transport for the scale-out roles (wire format, sockets, authentication)."""
