"""MCP servers made with the official ``mcp`` SDK, run by `trio_graceful.run`.

`serve_stdio` serves one over stdio: it exits on the first Ctrl+C or SIGTERM
after finishing its calls, never waits for stdin, and keeps the threads and
subprocesses of its tools under the runner's grace. Needs the ``mcp`` extra
(``pip install "trio-graceful[mcp]"``). See the how-to "MCP servers".
"""

from .._exports import present_as_package as _present_as_package
from ._stdio import EXIT_CODES as EXIT_CODES, serve_stdio as serve_stdio

# Where each public name is really defined; the documentation build needs it
# to find the docstrings of attributes in the source.
_defined_in: dict[str, str] = _present_as_package(globals(), __name__)
del _present_as_package
