"""The pace's part in a lockstep or deadline round on Flower's grid: timing the fit, counting the replies.

On the virtual clock (``strategies/rounds/pacing/pacer.py``) each fit instruction is timed
when it is sent; a device that will leave before it finishes is not sent one (its work
would be lost) and counts as ``clients-left``; the round then closes on the clock, and the
replies that came after the close are discarded and counted as ``clients-late``, however
Ray happened to schedule them. On the wall clock a deadline round stops waiting at its
target count or its deadline, and the messages unanswered by then are its late ones.
"""

from __future__ import annotations

from flwr.app import Message

from strategies.nodes.directory import NodeDirectory
from strategies.rounds.pacing.fleet_model import JobTiming
from strategies.rounds.pacing.pacer import Pacer, job_work
from strategies.rounds.phases import Instruction


def timed_instructions(pacer: Pacer, nodes: NodeDirectory, instructions: list[Instruction],
                       record: dict) -> tuple[list[Instruction], dict[int, JobTiming]]:  # fmt: skip
    """The instructions to send and, on the virtual clock, every sampled device's job times (by partition)."""
    if not pacer.virtual or not instructions:
        return instructions, {}
    jobs = {nodes.partition_of(ins.node): job_work(ins.config, ins.tensors, nodes.declared(ins.node).num_train)
            for ins in instructions}  # fmt: skip
    timings = pacer.time_jobs(jobs)
    kept = [ins for ins in instructions if timings[nodes.partition_of(ins.node)].left_at is None]
    if pacer.counts_departures:
        record["clients-left"] = len(instructions) - len(kept)
        record["left-partitions"] = sorted(p for p, t in timings.items() if t.left_at is not None)
    return kept, timings


def counted_replies(pacer: Pacer, nodes: NodeDirectory, server_round: int, replies: list[Message],
                    sent: list[Message], timings: dict[int, JobTiming],
                    record: dict) -> tuple[list[Message], list[Message]]:  # fmt: skip
    """The replies the round counts and the messages they answer; the late ones dropped and counted."""
    if pacer.virtual and timings:
        closed = pacer.close(timings, pacer.target(server_round, len(timings)))
        late = {m.metadata.message_id for m in sent if nodes.partition_of(str(m.metadata.dst_node_id)) in closed.late}
        replies = [r for r in replies if r.metadata.reply_to_message_id not in late]  # by the message each answers
        sent = [m for m in sent if m.metadata.message_id not in late]
        record["virtual-seconds"] = round(pacer.now, 6)
        if pacer.counts_departures:
            record.update({"clients-late": len(late), "late-partitions": list(closed.late)})
    elif pacer.pace == "deadline":
        answered = {r.metadata.reply_to_message_id for r in replies}
        record["clients-late"] = sum(m.metadata.message_id not in answered for m in sent)
        sent = [m for m in sent if m.metadata.message_id in answered]
    return replies, sent
