"""Fault injection users can run themselves: `python -m millstream.chaos` (see __main__.py)."""
