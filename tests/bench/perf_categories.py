#!/usr/bin/env python3
"""Sorts the samples of a `perf record --call-graph dwarf` profile of samsa
into what the CPU did: copies (by who asked for them), CRCs, thread
switches, the network stack, allocation, the rest.

    perf record -F 299 --call-graph dwarf,16384 -p <pids> -o perf.data -- sleep 25
    python3 tests/bench/perf_categories.py perf.data [cpu_ms]

With cpu_ms (the processes' CPU time over the same window, from
/proc/<pid>/stat) each share is also given in milliseconds. The leaf
function decides the category; for copies the nearest samsa, prost,
tonic, h2 or bytes frame above it names the caller. Prints a Markdown
table. Used for docs/BENCHMARKS.md, "Replication efficiency".
"""
import collections
import re
import subprocess
import sys

CALLER = re.compile(
    r"samsa_[a-z_]+::[A-Za-z_:]+[a-z_]|prost::[A-Za-z_:]+|tonic::codec::[A-Za-z_:]+"
    r"|h2::[A-Za-z_:]+|bytes::[A-Za-z_:]+"
)

# (category, leaf-symbol pattern); the first match wins.
LEAVES = [
    ("write into the page cache (pwrite)", r"copy_folio_from_iter"),
    ("copy out of the kernel (pread, socket read)", r"_copy_to_iter|copy_page_to_iter"),
    ("copy into the socket (send)", r"_copy_from_iter"),
    ("memcpy in user space", r"memcpy|memmove"),
    ("zero-fill (memset, clear_page)", r"memset|clear_page"),
    ("CRC-32C", r"crc32c|crc_u64"),
    (
        "thread switches and wake-ups",
        r"finish_task_switch|__schedule|schedule|try_to_wake_up|futex|_raw_spin_unlock_irq"
        r"|sched_yield|pick_next|dequeue_task|enqueue_task",
    ),
    (
        "network stack (TCP/IP, softirq, netfilter)",
        r"tcp_|ip_|__dev_queue|net_rx|napi|softirq|nf_|ipt_|skb|sock_|inet_|iowrite16",
    ),
    ("page cache and ext4 bookkeeping", r"ext4_|block_|mpage_|folio|buffer|drop_buffers|filemap"),
    ("allocation (malloc, free, slab)", r"malloc|free|_int_|slab|kmem_cache|unlink_chunk|mmap|munmap"),
]


def stacks(path):
    out = subprocess.run(
        ["perf", "script", "-i", path, "-F", "ip,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    current = []
    for line in out.splitlines():
        line = line.strip()
        if not line:
            if current:
                yield current
            current = []
            continue
        parts = line.split(" ", 1)
        if len(parts) == 2:
            current.append(parts[1])
    if current:
        yield current


def categorise(stack):
    leaf = stack[0]
    for name, pattern in LEAVES:
        if re.search(pattern, leaf):
            if name.startswith(("copy", "memcpy", "write into", "zero-fill")):
                caller = next((m.group(0) for f in stack[1:] if (m := CALLER.search(f))), "?")
                return name, caller
            return name, None
    return "other", None


def main():
    path = sys.argv[1]
    cpu_ms = float(sys.argv[2]) if len(sys.argv) > 2 else None
    by_category = collections.Counter()
    by_caller = collections.defaultdict(collections.Counter)
    total = 0
    for stack in stacks(path):
        total += 1
        name, caller = categorise(stack)
        by_category[name] += 1
        if caller:
            by_caller[name][caller] += 1
    print(f"{total} samples" + (f", {cpu_ms:.0f} ms of CPU" if cpu_ms else ""))
    print()
    print("| what | share | " + ("ms | " if cpu_ms else "") + "main callers |")
    print("|---|---|" + ("---|" if cpu_ms else "") + "---|")
    for name, count in by_category.most_common():
        share = count / total
        callers = ", ".join(
            f"{c.split('::')[-1] or c} {100 * n / total:.1f}%"
            for c, n in by_caller[name].most_common(3)
        )
        ms = f"{share * cpu_ms:.0f} | " if cpu_ms else ""
        print(f"| {name} | {100 * share:.1f}% | {ms}{callers} |")


if __name__ == "__main__":
    main()
