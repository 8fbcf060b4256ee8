"""The `settings` table: the app's settings as JSON values by key (app/config.py reads them
typed and checked)."""
from __future__ import annotations

import json
from typing import Any

from .database import Database
from .errors import StoreError


class SettingValues:
    def __init__(self, db: Database):
        self.db = db

    def get(self, key: str, default: Any = None) -> Any:
        rows = self.db.rows("SELECT value_json FROM settings WHERE key = ?", (key,))
        return json.loads(rows[0]["value_json"]) if rows else default

    def set(self, key: str, value: Any) -> None:
        try:
            encoded = json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"setting {key!r}: not JSON-serialisable: {exc}") from exc
        with self.db.tx() as conn:
            conn.execute(
                "INSERT INTO settings (key, value_json) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value_json = excluded.value_json",
                (key, encoded),
            )

    def delete(self, key: str) -> None:
        with self.db.tx() as conn:
            conn.execute("DELETE FROM settings WHERE key = ?", (key,))

    def all(self) -> dict[str, Any]:
        return {r["key"]: json.loads(r["value_json"]) for r in self.db.rows("SELECT * FROM settings")}
