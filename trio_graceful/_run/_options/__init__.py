"""The options of `trio_graceful.run`, and the command line that sets them.

This room owns each option's default and check (``_runoptions``), what `run`
settles from them once ``main`` is known, and the command-line options
derived from them (``_arguments``).
"""
