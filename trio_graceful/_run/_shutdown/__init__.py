"""The shutdown of a run: its sequence, its stages and its time.

This room owns the shutdown's sequence and deadlines (``_sequence``: the
withdrawal, the drain under one deadline, the force), the runner's stages as
one table, and the lifecycle's one writer (``_stages``), the stop time and
the stop budget it must fit (``_stoptime``), and the collector's deferral
while a shutdown runs, counted for the process (``_gcdeferral``).
"""
