"""The runner: `trio_graceful.run`, grouped in rooms by what each does.

* ``_program``: one run of a program, from start to exit status: `run` and
  `Runner`, ``main``, the lifecycle, the services, and what the program tells
  those who watch it (probes, `ProgramStatus`);
* ``_shutdown``: the shutdown: its sequence, its stages, its stop time and
  the budget it must fit, and the collector put off while it runs;
* ``_signals``: shutdown signals, from the process's handlers to the run, and
  what the n-th one does;
* ``_exit``: how the process ends: the exit status, the emergency exit, and
  the bounded exit after a run that took a signal;
* ``_options``: the options of `run`, and the command line that sets them.

The top of the private layers: it uses `trio_graceful._core`,
`trio_graceful._children` and `trio_graceful._deploy`.
"""
