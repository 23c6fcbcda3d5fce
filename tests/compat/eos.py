"""A small exactly-once checker for the Python compat tests (the Rust one is
samsa_tests::checker): sends with unique values, acknowledgements, reads."""


class Checker:
    def __init__(self):
        self.order = {}      # value -> send index
        self.acks = {}       # value -> (partition, offset)
        self.failed = {}     # value -> error
        self.reads = {}      # (partition, offset) -> set(values)

    def send(self, value: bytes):
        assert value not in self.order, f"test bug: {value!r} sent twice"
        self.order[value] = len(self.order)

    def ack(self, value: bytes, partition: int, offset: int):
        assert value not in self.acks, f"{value!r} acknowledged twice"
        self.acks[value] = (partition, offset)

    def fail(self, value: bytes, err):
        self.failed[value] = str(err)

    def read(self, partition: int, offset: int, value: bytes):
        self.reads.setdefault((partition, offset), set()).add(value)

    def problems(self):
        out = []
        seen = {}
        for (p, o), vals in sorted(self.reads.items()):
            if len(vals) > 1:
                out.append(f"offset conflict at {p}/{o}: {sorted(vals)}")
            for v in vals:
                seen.setdefault(v, []).append((p, o))
        for v, places in seen.items():
            if len(places) > 1:
                out.append(f"duplicate {v!r} at {places}")
            if v not in self.order:
                out.append(f"unknown value {v!r} at {places}")
            elif v in self.acks and self.acks[v] not in places:
                out.append(f"{v!r} acked at {self.acks[v]} but read at {places}")
        for v, where in self.acks.items():
            if v not in seen:
                out.append(f"lost {v!r} (acked at {where})")
        # per-partition log order follows send order (one producer per test)
        last = {}
        for (p, o), vals in sorted(self.reads.items()):
            for v in vals:
                if v in self.order:
                    if p in last and self.order[v] < last[p][0]:
                        out.append(f"order: {v!r} at {p}/{o} after {last[p][1]!r}")
                    last[p] = (self.order[v], v)
        return out

    def assert_ok(self):
        probs = self.problems()
        assert not probs, f"{len(probs)} exactly-once problems:\n" + "\n".join(probs[:50])
