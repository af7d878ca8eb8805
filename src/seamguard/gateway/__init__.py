"""seamguard gateway: an OpenAI-compatible inference gateway with token-level admission and fabric-aware routing."""
