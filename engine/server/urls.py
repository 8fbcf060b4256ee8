"""The API families a server may serve and the base URL each family's clients take: light (no
aiohttp), so the window's Settings show them without loading the server."""
from __future__ import annotations

API_FAMILIES = ("openai", "anthropic", "ollama")  # OpenAI's (chat, completions, responses), Anthropic's, Ollama's
SHOWN_NAMES = {"openai": "OpenAI", "anthropic": "Anthropic", "ollama": "Ollama"}
FAMILY_NAMES = {family: f"{name}'s" for family, name in SHOWN_NAMES.items()}  # in sentences


def client_urls(host: str, port: int, families, ollama_port: int | None = None) -> dict[str, str]:
    """Per family served, what to paste into its clients: OpenAI's base URL (with /v1),
    Anthropic's (the SDK's base_url, Claude Code's ANTHROPIC_BASE_URL: without /v1) and Ollama's
    (OLLAMA_HOST: its own port when it has one)."""
    host = f"[{host}]" if ":" in host else host
    root = f"http://{host}:{port}"
    urls = {"openai": f"{root}/v1", "anthropic": root, "ollama": f"http://{host}:{ollama_port or port}"}
    return {family: urls[family] for family in API_FAMILIES if family in families}
