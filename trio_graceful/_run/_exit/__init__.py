"""How the process ends: its exit status, and within what time.

This room owns the exit status and why it is what it is (``_status``), the
emergency exit when a shutdown cannot finish (``_watchdog``, with how late a
thread is, ``_lateness``, and the picture of the task tree it prints,
``_tasktree``), and the exit after a run that took a signal: the process's
one guard (``_guard``) and what it is armed with (``_policy``).
"""
