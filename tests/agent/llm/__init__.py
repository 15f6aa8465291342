"""LLM stream fixtures: each dialect's documented event sequences (sse_events), the replay
server that serves them to the vendors' real client libraries, and the tiny real engine."""
