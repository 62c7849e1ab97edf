"""Errors the CLI prints as one line and exit 2: the user's input, not a bug in mxc."""


class UserError(Exception):
    def __init__(self, message: str, suggestion: str = "", code: int = 2) -> None:
        self.suggestion = suggestion
        self.code = code
        super().__init__(message)

    def __str__(self) -> str:
        # Paths and names from the command line may hold anything: one line, no terminal escapes.
        # (Imported here: mxc.compiler loads pydantic and jinja2, and only an error needs it.)
        from mxc.compiler.errors import printable

        text = super().__str__()
        return printable(f"{text} ({self.suggestion})" if self.suggestion else text)
