"""Client of OpenAI-compatible servers: HTTP/SSE transport (http.py) and the Engine adapter (client.py)."""
