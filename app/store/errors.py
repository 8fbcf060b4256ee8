"""The store's errors; each message names the file or field and says why."""


class StoreError(Exception):
    """A problem with the chat database or data dir; the message says which file and why."""


class StoreLockedError(StoreError):
    """Another Tramontane instance holds the data dir."""


class NotFoundError(StoreError):
    """A chat or message id that does not exist (any more)."""
