"""LLM stream fixtures: the replay server that serves each dialect's documented event
sequences (demo/sse_events.py) to the vendors' real client libraries, and the tiny real engine
(the model: demo/tiny_model.py), with LiteLLM in front of it."""
