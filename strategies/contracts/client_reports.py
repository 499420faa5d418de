"""What every client reports, under names the strategies read: its metrics and its preflight properties.

Each method declares its own metrics beside these in its contract; :data:`FIT_METRICS` and
:data:`EVALUATE_METRICS` are the ones every client sends, with the bounds a reply is screened
against (``strategies/screening/replies.py``).
"""

from __future__ import annotations

from strategies.contracts.contract import Metric

# a client's work in one round, as it reports it: a trillion gradient evaluations is days of any GPU's time, so a
# larger claim (10**30 steps) is a client that lies or is broken, and would swamp the round's sums
MAX_CLIENT_COUNT = 1e12
MAX_REASONABLE_LOSS = 1e6  # cross-entropy of a uniform guess over 1e6 classes is ~14: beyond this a client is broken

# Metric keys every client reports (strategies read the same names).
TRAIN_LOSS, LOCAL_STEPS, GRAD_EVALS, HVP_EVALS, SAMPLE_GRADS = (
    "train-loss", "local-steps", "grad-evals", "hvp-evals", "sample-grads")  # fmt: skip
ACCURACY, GLOBAL_ACCURACY, GLOBAL_LOSS = "accuracy", "global-accuracy", "global-loss"
PARTITION_ID, NUM_PARTITIONS = "partition-id", "num-partitions"
# A node that cannot build its client answers the preflight with these properties (clients/unavailable.py);
# scope "node" means the fault is in that node's own data (the run goes on without it), else in the run.
PREFLIGHT_ERROR, PREFLIGHT_DETAIL, PREFLIGHT_SCOPE = "preflight-error", "preflight-detail", "preflight-scope"
# What every node reports of its data: its own data-dir (deployed devices), sizes, and "index:count ..." per split.
DATA_DIR, NUM_TRAIN, NUM_TEST = "data-dir", "num-train", "num-test"
TRAIN_CLASSES, TEST_CLASSES = "train-classes", "test-classes"
DATA_FINGERPRINT = "data-fingerprint"  # SHA-256 of a node's arrays (ClientData.fingerprint): which data it trained on
RAY_NODE = "ray-node"  # the Ray node id a simulated client answered the preflight on ("" outside Ray)
SMALL_BATCH = "small-batch"  # 1 when a batch size exceeded the client's training set and min(b, n) was used
START_LOSS = "start-loss"  # the first local step's loss: the model as received, on the client's first batch

FIT_METRICS = (
    Metric(TRAIN_LOSS, "mean training loss over the local steps", 0.0, MAX_REASONABLE_LOSS),
    Metric(START_LOSS, "the first local step's loss (the model as received, on the first batch)", 0.0,
           MAX_REASONABLE_LOSS),  # fmt: skip
    Metric(LOCAL_STEPS, "local steps taken", 0.0, MAX_CLIENT_COUNT, summary=("sum",), record_as="client-steps"),
    Metric(GRAD_EVALS, "mini-batch gradient evaluations", 0.0, MAX_CLIENT_COUNT, summary=("sum",)),
    Metric(HVP_EVALS, "Hessian-vector products", 0.0, MAX_CLIENT_COUNT, summary=("sum",)),
    Metric(SAMPLE_GRADS, "per-example gradients", 0.0, MAX_CLIENT_COUNT, summary=("sum",)),
    Metric(SMALL_BATCH, "1 if a batch size exceeded the training set and min(b, n) examples were used", 0.0, 1.0,
           summary=("sum",), record_as="clients-small-batch"),
    Metric(PARTITION_ID, "the client's partition (the record lists them as fit-partitions)", 0.0, summary=()),
)
EVALUATE_METRICS = (
    Metric(ACCURACY, "personalised test accuracy (after adaptation)", 0.0, 1.0),
    Metric(GLOBAL_ACCURACY, "test accuracy of the model as received", 0.0, 1.0),
    Metric(GLOBAL_LOSS, "test loss of the model as received", 0.0, MAX_REASONABLE_LOSS),
    Metric(GRAD_EVALS, "gradient evaluations of the adaptation", 0.0),
    Metric(PARTITION_ID, "the client's partition", 0.0),
)
