"""memplan's exit statuses (README.md, "Exit status") and the exception that carries them."""

EXIT_OK = 0
EXIT_DOES_NOT_FIT = 1  # a result (check, suggest), never raised
EXIT_USAGE = 2
EXIT_INPUT = 3  # bad input: a model that fails validation, a recipe key memplan refuses
EXIT_DEVICE = 4
EXIT_INTERNAL = 5
EXIT_NO_BINARY = 127  # this package's own: no memplan binary to run


class MemplanError(Exception):
    """memplan failed: `message` is its one-line error (without "memplan: error: "), `code` its exit
    status, `argv` the command line that ran, `stderr` all it wrote there"""

    def __init__(self, message, code, argv=None, stderr=""):
        super().__init__(message)
        self.message = message
        self.code = code
        self.argv = list(argv or [])
        self.stderr = stderr

    def __str__(self):
        return "%s (memplan exit status %s)" % (self.message, self.code)


class SchemaError(MemplanError, ValueError):
    """the report is not schema 1 as this package reads it"""

    def __init__(self, message, argv=None, stderr=""):
        super().__init__(message, EXIT_INTERNAL, argv, stderr)
