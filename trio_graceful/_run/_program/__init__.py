"""One run of a program, from its start to its exit status.

This room owns the run itself: `run` and `Runner` (``_runner``), the
``Program`` that ties the other rooms together (``_program``), running
``main`` (``_mainrun``), the public `Lifecycle` and its table
(``_lifecycle``), the ordered services (``_services``), and what the program
tells the outside: `ProgramStatus` (``_programstatus``) and the policy of the
health endpoint and sd_notify (``_probes``).
"""
