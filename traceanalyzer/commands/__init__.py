"""CLI commands that live in their own modules; each defines register(app)."""
