"""Trust between the parts: the deployment's own CA, identities read from certificates,
one authorization table and the interceptor that enforces it (DESIGN §10a)."""
