"""my-plugin: a stand-in vLLM attention plugin (numpy only)."""
