"""Stand-ins for the NVIDIA libraries (the CUDA driver and NVML, at their C ABI), so the
demo's inference route, the tests and bench-gpu run the agent's real GPU path without a GPU."""
