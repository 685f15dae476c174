"""The runner: signals, the lifecycle, ordered services and the emergency exit.

The top of the private layers: it uses `trio_graceful._core`,
`trio_graceful._children` and `trio_graceful._deploy`.
"""
