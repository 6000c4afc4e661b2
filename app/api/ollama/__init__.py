"""Ollama's API (`/api/*`) on the gateway: see `app.api.ollama.routes`."""
