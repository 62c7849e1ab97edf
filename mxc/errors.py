"""Errors the CLI prints as one line and exit 2: the user's input, not a bug in mxc."""


class UserError(Exception):
    def __init__(self, message: str, suggestion: str = "", code: int = 2) -> None:
        self.suggestion = suggestion
        self.code = code
        super().__init__(message)

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} ({self.suggestion})" if self.suggestion else text
