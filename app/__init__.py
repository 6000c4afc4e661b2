"""microscheduler: an OpenAI-compatible gateway that owns one GPU's VRAM."""
