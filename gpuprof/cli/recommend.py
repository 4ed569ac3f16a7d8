"""Placeholder: the recommend verb is registered here."""
