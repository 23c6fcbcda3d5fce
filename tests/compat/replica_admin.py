"""kafka-python's admin client against a samsa cluster: ElectLeaders,
ListPartitionReassignments and AlterPartitionReassignments, as an
operator's script calls them. Run by tests/it/reassignment.rs on a
three-node cluster whose partition 0 of --topic has replicas [1, 2, 3]
and is led by another broker after a failover; exits non-zero with the
reason when an answer is not Kafka's.
"""

import argparse
import sys

from kafka import KafkaAdminClient
from kafka.errors import NoReassignmentInProgressError
from kafka.structs import TopicPartition


def fail(why):
    print(f"replica_admin: {why}", file=sys.stderr)
    sys.exit(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    admin = KafkaAdminClient(bootstrap_servers=args.bootstrap, request_timeout_ms=30000)
    tp = TopicPartition(args.topic, 0)

    # PREFERRED (election type 0): broker 1 leads again.
    response = admin.elect_leaders(0, {args.topic: [0]})
    results = [
        (r.topic, p.partition_id, p.error_code)
        for r in response.replica_election_results
        for p in r.partition_result
    ]
    if results != [(args.topic, 0, 0)]:
        fail(f"ElectLeaders answered {results}")
    # Again: nothing to do (ELECTION_NOT_NEEDED, which the client ignores).
    again = admin.elect_leaders(0, {args.topic: [0]})
    codes = [p.error_code for r in again.replica_election_results for p in r.partition_result]
    if codes != [84]:
        fail(f"a second ElectLeaders answered {codes}, not ELECTION_NOT_NEEDED")

    if admin.list_partition_reassignments() != {}:
        fail("reassignments listed while none runs")
    # Cancelling nothing.
    cancelled = admin.alter_partition_reassignments({tp: None})
    if cancelled.get(tp) is not NoReassignmentInProgressError:
        fail(f"cancelling nothing answered {cancelled}")
    # The same replicas in another order: done at once, broker 1 still first.
    reordered = admin.alter_partition_reassignments({tp: [1, 3, 2]})
    if reordered != {tp: None}:
        fail(f"a reordering answered {reordered}")
    if admin.list_partition_reassignments([tp]) != {}:
        fail("a reordering is listed as in progress")
    admin.close()
    print("replica_admin: ok")


if __name__ == "__main__":
    main()
