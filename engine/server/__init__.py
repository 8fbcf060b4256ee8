"""An OpenAI-compatible HTTP server for the loaded model (`tramontane-cli serve`, the window's switch)."""
