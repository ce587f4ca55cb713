"""The one error type the REST handlers turn into an HTTP answer."""

from __future__ import annotations


class PanelRequestError(Exception):
    """A request the server cannot carry out because of what the client sent or what is on disk.

    ``status`` is the HTTP status, ``fields`` maps config keys to messages for the panel to
    show next to each field, ``detail`` carries extra JSON (e.g. a parse error's line).

    Example::

        >>> PanelRequestError(400, "bad body").to_json()
        {'message': 'bad body', 'fields': {}}
    """

    def __init__(self, status: int, message: str, *, fields: dict | None = None, detail: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.fields = fields or {}
        self.detail = detail or {}

    def to_json(self) -> dict:
        return {"message": self.message, "fields": self.fields, **self.detail}
