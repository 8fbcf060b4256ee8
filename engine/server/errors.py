"""The server's one refusal: an `ApiError` carries a status, a sentence naming the field, and
OpenAI's error fields; each API module writes it in its own shape (OpenAI's is `body()`)."""
from __future__ import annotations

_ERROR_TYPES = {401: "authentication_error", 403: "permission_error"}  # else by status class


class ApiError(Exception):
    """A refusal in OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def kind(self) -> str:
        """OpenAI's (and Anthropic's) error type for the status."""
        return _ERROR_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(param: str, message: str, status: int = 400, code: str | None = None) -> ApiError:
    return ApiError(status, f"{param}: {message}", param, code)
