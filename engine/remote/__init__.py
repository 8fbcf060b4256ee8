"""Client of OpenAI-compatible servers: HTTP/SSE transport (transport.py) and the Engine adapter (client.py)."""
