// Parallax agent: kernel side (bcc C; tracepoints and a libc uretprobe, no kprobes; no
// header-derived kernel struct: the socket and task fields read directly have their offsets
// from the running kernel's BTF, PX_OFF_*).
//
// The loader defines, with -D:
//   PX_HEAD_WINDOW   request bytes captured per read (power of two, 256..16384)
//   PX_RESP_WINDOW   bytes captured from a write that starts a response ("HTTP/")
//   PX_MAX_CONNS     size of the connection LRU maps
//   PX_HAVE_<TP>     one per optional tracepoint the running kernel has (fields checked)
//   PX_SOCK_HOOKS    the default on x86-64 from Linux 6.3: no syscall tracepoint at all
//   PX_RAW_SYSCALLS  else: raw_syscalls:sys_enter/exit (x86-64), else per-syscall ones
//   PX_OFF_TCP_SRTT, PX_OFF_SKC_NUM  tcp_sock.srtt_us, sock_common.skc_num (from BTF)
//   PX_OFF_TASK_TGID, PX_OFF_TASK_PID  task_struct.tgid, .pid (from BTF; direct loads)
//   PX_HOLDS         write-to-wire holdback (hold.h), with its PX_OFF_TCP_*, PX_OFF_SKB_*
//   PX_RTX_SEGS, PX_RTX_DATA_WAIT, PX_RTX_SYN_WAIT  retransmits (tcp.h): segments per skb,
//                    the waits of data and SYN-ACKs, with their PX_OFF_RTX_* (from BTF)
//   PX_HAVE_RETRANSMIT_ERR  tcp_retransmit_skb has its err field (6.12+)
//   PX_SDR_BTF       compile px_sdr_btf, sk_data_ready as a BTF tracepoint (agent/tpbtf.py)
//   C_<COUNTER>      the px_counters indices (agent/loader.py COUNTERS)
//
// Flow with PX_SOCK_HOOKS (see docs/agent.md):
//   sock_recv_length / sock_send_length (inside the read or write, traced tgid only): the
//     socket, the length, and the syscall's own arguments from the task's user pt_regs
//     (fd, buffer) -> READ event with the request head; a write starting "HTTP/" -> RESP
//     event; other writes are aggregated per connection in px_aggs (first 256 timestamps,
//     then counts and sums) and flushed as one WAGG event at the next boundary (a read
//     with data, the next response, close, the chunked terminator, the stream limit).
//   tcp_sendmsg_locked: the time a write starts (before the copy).
//   libc accept()/accept4() return (uretprobe): the new fd and t_acc.
//   Syscall tracepoints are never attached: once one is, every syscall of every task on
//   the node takes the kernel's slow path (a 1-byte dd measured 1.3-1.6x slower).
// Without it, a syscall's entry records {fd, buf, kind} in px_active[thread], the
// sock_*_length tracepoints link the socket, and its exit does the above.
//   softirq tracepoints (handshake, data arrival, srtt, retransmits) are keyed by the socket
//   address, never by pid: they run with whatever task is on the CPU.
//
// The program is one translation unit; its parts are headers by concern under bpf/agent/,
// included here in dependency order (the loader passes -I bpf/).

#include "agent/defs.h"
#include "agent/config.h"
#include "agent/state.h"
#include "agent/output.h"
#include "agent/sample.h"
#include "agent/uio.h"
#include "agent/tls.h"
#include "agent/hold.h"
#include "agent/proto/http2.h"
#include "agent/proto/stream.h"
#include "agent/proto/http1.h"
#include "agent/syscalls.h"
#ifdef PX_SOCK_HOOKS
#include "agent/sock_hooks.h"
#else
#include "agent/syscall_hooks.h"
#endif
#include "agent/tcp.h"
#include "agent/tls_uprobes.h"
