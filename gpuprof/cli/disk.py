"""Placeholder: the disk verb is registered here."""
