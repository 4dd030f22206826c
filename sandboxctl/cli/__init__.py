"""Thin Typer commands: parse flags, call the core or a service, render with rich."""
