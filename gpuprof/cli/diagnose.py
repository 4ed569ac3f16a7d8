"""Placeholder: the diagnose verb is registered here."""
