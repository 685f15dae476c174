"""The deployment protocols: the HTTP health endpoint and sd_notify.

Protocols only, with no policy of when to be ready or healthy (that is the
runner's, in `trio_graceful._run`). Built on `trio_graceful._core` and
`trio_graceful._children`.
"""
