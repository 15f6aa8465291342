"""parallax-agent: times every HTTP request a server handles from the kernel (eBPF, bcc)."""
