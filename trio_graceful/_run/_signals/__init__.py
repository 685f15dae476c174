"""Shutdown signals: from the process's handlers to the run, counted once.

This room owns the Python-level handlers and their relay to the Trio thread
(``_relay``), and the one escalation count with what the n-th signal does
(``_escalation``).
"""
