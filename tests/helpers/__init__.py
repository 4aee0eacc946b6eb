"""Shared test helpers (scripts run as subprocesses live beside this file)."""
