"""The widgets the main window is built from: conversation, composer, chat list, model bar."""
