"""Saved chats: the store of one data dir (SQLite database, image files, lock) and export.

store.py holds the Store, which composes one part per domain over one connection
(database.py): chats.py, messages.py, versions.py, replies.py, attachments.py,
tool_messages.py, setting_values.py, search.py; schema.py the database file (schema,
migrations, search index); images.py the image files; lock.py the one-instance lock;
rows.py the row types and their conversion to engine types; export.py Markdown/JSON export
and JSON import. `from tramontane.app.store import Store` is all most callers need.
"""
from .errors import NotFoundError, StoreError, StoreLockedError
from .images import image_extension
from .rows import ROLES, STATES, Chat, ChatInfo, Message, StoredImage
from .store import Store, default_data_dir

__all__ = ["ROLES", "STATES", "Chat", "ChatInfo", "Message", "NotFoundError", "Store",
           "StoreError", "StoredImage", "StoreLockedError", "default_data_dir", "image_extension"]
