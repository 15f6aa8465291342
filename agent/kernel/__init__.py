"""The kernel side as user space sees it: compiling and attaching the eBPF programs
(``loader``), the ring buffer and its record layouts (``ringbuf``, ``events``), BTF offsets
(``btf``, ``tpbtf``), tracefs and the tracepoint catalogue, uprobes (libc's accept, the TLS
libraries), the write-to-wire holdback's hooks, ``sock_diag`` and the clock."""
