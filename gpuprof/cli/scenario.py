"""Placeholder: the scenario verb is registered here."""
