"""The app's dialogs: models (hub, downloads, local files), servers, settings."""
