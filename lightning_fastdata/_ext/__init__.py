"""Optional compiled helpers (built by setup.py when libjpeg-turbo headers are present)."""
