"""The agent's GPU parts: NVML readings per device and per process (agent.gpu.nvml)."""
