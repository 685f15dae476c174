"""Children of other kinds: threads, subprocesses, asyncio, standard input.

Built on `trio_graceful._core` only.
"""
