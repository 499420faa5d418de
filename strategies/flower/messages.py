"""A phase's messages out of the round's instructions, and its replies read back into stamen's values.

:func:`instruction_messages` writes each node's instruction as a ``train`` or ``evaluate``
message (its array sets as named ArrayRecords, :mod:`strategies.flower.codec`);
:func:`read_replies` reads the replies to them into :class:`strategies.screening.replies.Received`
(or ``Evaluation``) and names every failure: a message sent without a usable reply.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO

from flwr.app import Message
from flwr.common.logger import log

from strategies.contracts.payload import Scalar
from strategies.flower.codec import LOSS, MessageFormatError, instruction, read_reply
from strategies.flower.fleet import failure_of, replies_by_node
from strategies.nodes.failures import NodeError, NodeFailureError
from strategies.rounds.phases import Instruction
from strategies.screening.replies import Evaluation, Received

RESERVED = ("partition-id", "payload", "server-round")  # config keys a user's train_config may not set


def instruction_messages(instructions: list[Instruction], extra: dict[str, Scalar], *, kind: str, group: str,
                         names: Sequence[str], shadowed: set[str]) -> list[Message]:  # fmt: skip
    """One ``kind`` message per instruction, ``extra`` config values added (a user's ``train_config``).

    A key of ``extra`` that stamen also sends overrides stamen's value and is logged once
    (``shadowed`` remembers which were); one stamen sets per message is refused.

    Raises
    ------
    ValueError
        If ``extra`` sets ``partition-id``, ``payload`` or ``server-round``.

    """
    if reserved := sorted(set(extra) & set(RESERVED)):
        raise ValueError(f"{kind}_config may not set {reserved}: stamen sets them per message")
    messages = []
    for ins in instructions:
        if over := sorted(k for k in extra if k in ins.config and k not in shadowed):
            log(INFO, "stamen: %s_config sets %s over stamen's values", kind, ", ".join(over))
            shadowed.update(over)
        content = instruction(ins.tensors, {**ins.config, **extra}, names)
        messages.append(Message(content=content, dst_node_id=int(ins.node), message_type=kind, group_id=group))
    return messages


def read_replies(replies: Iterable[Message], sent: list[Message], *, fit: bool, names: Sequence[str],
                 waited_s: float) -> tuple[list[Received | Evaluation], list[NodeFailureError]]:  # fmt: skip
    """The replies to ``sent`` as the round's phases read them, and the failures: errors, unreadable, missing.

    A fit reply whose model arrays are named otherwise than ``names`` (what the server
    sent) is unreadable: renamed arrays are never averaged.
    """
    results, failures = [], []
    answers = replies_by_node(sent, replies)
    for message in sent:  # failures are the messages sent less the usable replies
        node = message.metadata.dst_node_id
        answer = answers.get(node)
        if (failure := failure_of(answer, node, waited_s)) is not None:
            failures.append(failure)
            continue
        try:
            tensors, num_examples, metrics, replied = read_reply(answer.content)
            if fit and replied and list(replied) != list(names or replied):
                raise MessageFormatError(f"the reply's arrays are named {replied[:4]}..., the server sent "
                                         f"{list(names)[:4]}...")  # fmt: skip
        except (MessageFormatError, KeyError, TypeError) as err:
            failures.append(NodeError(f"unreadable reply: {err}", cid=str(node)))
            continue
        if fit:
            results.append(Received(str(node), tensors, num_examples, metrics))
        else:
            results.append(Evaluation(str(node), metrics.pop(LOSS, float("nan")), num_examples, metrics))
    return results, failures
