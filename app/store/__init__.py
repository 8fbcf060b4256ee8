"""Saved chats: the store of one data dir (SQLite database, image files, lock) and export."""
from .store import (ROLES, STATES, Chat, ChatInfo, Message, NotFoundError, Store, StoreError,
                    StoredImage, StoreLockedError, default_data_dir, image_extension)

__all__ = ["ROLES", "STATES", "Chat", "ChatInfo", "Message", "NotFoundError", "Store",
           "StoreError", "StoredImage", "StoreLockedError", "default_data_dir", "image_extension"]
