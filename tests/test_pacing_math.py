"""The pacing maths against hand computations and closed forms: the fleet model, the clock, staleness, the limits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from strategies.rounds.pacing.fleet_model import Availability, FleetModel, JobTiming, lognormal_fleet, read_trace
from strategies.rounds.pacing.participation import Participation
from strategies.rounds.pacing.schedule import WAIT_S, Slots, close_round
from strategies.rounds.pacing.staleness import rebase, staleness_weight


def test_lognormal_fleet_has_the_asked_spread_and_one_seed_gives_one_fleet():
    fleet = lognormal_fleet(list(range(4000)), seed=3, step_seconds=0.1, spread=10.0, bandwidth=1e6,
                            on_seconds=600, off_seconds=300)  # fmt: skip
    times = np.array(list(fleet.step_seconds.values()))
    p10, p50, p90 = np.percentile(times, [10, 50, 90])
    assert p90 / p10 == pytest.approx(10.0, rel=0.1)
    assert p50 == pytest.approx(0.1, rel=0.05)
    again = lognormal_fleet(list(range(4000)), seed=3, step_seconds=0.1, spread=10.0, bandwidth=1e6,
                            on_seconds=600, off_seconds=300)  # fmt: skip
    assert again.step_seconds == fleet.step_seconds
    assert [again.availability[7].next_on(t) for t in (0, 5e3, 5e4)] == [fleet.availability[7].next_on(t)
                                                                         for t in (0, 5e3, 5e4)]  # fmt: skip


def test_availability_share_matches_the_on_and_off_means():
    on = Availability(on_seconds=600, off_seconds=200, seed=(1,))
    grid = np.arange(0, 2e6, 50.0)
    share = np.mean([on.window_at(t) is not None for t in grid])
    assert share == pytest.approx(0.75, abs=0.03)


def test_a_job_time_is_download_steps_upload_and_a_closing_window_makes_the_device_leave():
    fleet = FleetModel(step_seconds={0: 0.5, 1: 0.5}, bandwidth={0: 1000.0, 1: 1000.0},
                       availability={0: Availability(), 1: Availability(fixed=((0.0, 4.0),))})  # fmt: skip
    assert fleet.timing(0, 1.0, steps=4, bytes_down=500, bytes_up=1500) == JobTiming(1.0, 1.0 + 0.5 + 2.0 + 1.5)
    leaves = fleet.timing(1, 1.0, steps=4, bytes_down=500, bytes_up=1500)
    assert leaves.left_at == 4.0 and leaves.ends_at == 4.0
    with pytest.raises(ValueError, match="off"):
        fleet.timing(1, 5.0, steps=1, bytes_down=0, bytes_up=0)


def test_a_trace_gives_each_partition_its_speed_link_and_windows(tmp_path):
    trace = tmp_path / "fleet.csv"
    trace.write_text("partition,step-seconds,bandwidth,windows\n0,0.2,1000,\n1,2.0,500,0-60;120-180\n")
    fleet = read_trace(trace, [0, 1])
    assert fleet.step_seconds == {0: 0.2, 1: 2.0} and fleet.bandwidth == {0: 1000.0, 1: 500.0}
    assert fleet.is_on(0, 1e9) and fleet.is_on(1, 30) and not fleet.is_on(1, 90)
    assert fleet.availability[1].next_on(90) == 120 and fleet.availability[1].next_on(200) == math.inf
    with pytest.raises(ValueError, match="no row for partitions \\[2\\]"):
        read_trace(trace, [0, 1, 2])
    trace.write_text("partition,step-seconds,bandwidth,windows\n0,fast,1000,\n")
    with pytest.raises(ValueError, match="line 2"):
        read_trace(trace, [0])


def test_close_round_by_hand():
    timings = {0: JobTiming(0, 3.0), 1: JobTiming(0, 1.0), 2: JobTiming(0, 2.0), 3: JobTiming(0, 9.0, left_at=1.5)}
    deadline = close_round(timings, target=2, wait_s=10.0, opened_at=0.0)
    assert (deadline.closed_at, deadline.on_time, deadline.late, deadline.left) == (2.0, (1, 2), (0,), (3,))
    lockstep = close_round(timings, target=4, wait_s=10.0, opened_at=0.0)  # waits for the one that left
    assert (lockstep.closed_at, lockstep.on_time, lockstep.late) == (10.0, (0, 1, 2), ())
    cut = close_round(timings, target=3, wait_s=2.5, opened_at=0.0)  # the deadline comes before the 3rd reply
    assert (cut.closed_at, cut.on_time, cut.late) == (2.5, (1, 2), (0,))
    everyone = close_round({0: JobTiming(0, 3.0), 1: JobTiming(0, 1.0)}, target=2, wait_s=10.0, opened_at=0.0)
    assert everyone.closed_at == 3.0 and everyone.late == ()
    # no deadline: a reply however slow is not late, and a device that left holds the round WAIT_S
    slow = close_round({0: JobTiming(0, 5000.0), 1: JobTiming(0, 1.0)}, target=2, wait_s=math.inf, opened_at=0.0)
    assert slow.closed_at == 5000.0 and slow.late == ()
    gone = close_round(timings, target=4, wait_s=math.inf, opened_at=1.0)
    assert gone.closed_at == 1.0 + WAIT_S and gone.on_time == (0, 1, 2)


def test_staleness_weights_by_hand_and_rebase():
    assert [staleness_weight(t) for t in (0, 3, 8)] == [1.0, 0.5, pytest.approx(1 / 3)]
    assert staleness_weight(5, "none") == 1.0
    with pytest.raises(ValueError, match="staleness rule"):
        staleness_weight(1, "cubic")
    newest, sent, reply = [np.array([1.0, 1.0])], [np.array([0.0, 0.0])], [np.array([2.0, -2.0])]
    assert np.allclose(rebase(newest, sent, reply, 0.5, [True])[0], [2.0, 0.0])  # 1 + 0.5 * (2, -2)
    assert rebase(sent, sent, reply, 1.0, [True])[0] is reply[0]
    counter = [np.array([7], dtype=np.int64)]
    assert rebase(counter, [np.array([1])], [np.array([3])], 0.5, [False])[0] is counter[0]


def test_participation_correction_weights_by_hand():
    participation = Participation(partitions=[0, 1], correction="inverse-participation")
    for _ in range(7):
        participation.add(0, 0)
    participation.add(1, 4)
    # smoothed shares (7 + 1) / (8 + 2) = 0.8 and 0.2 against the uniform 0.5
    assert participation.weight(0) == pytest.approx(0.5 / 0.8)
    assert participation.weight(1) == pytest.approx(0.5 / 0.2)
    assert participation.shares() == {0: 7 / 8, 1: 1 / 8}
    assert Participation(partitions=[0, 1]).weight(0) == 1.0


def _slot_trace(seed: int) -> list[tuple[int, int, float]]:
    fleet = lognormal_fleet(list(range(30)), seed=seed, step_seconds=0.1, spread=10.0, bandwidth=1e5,
                            on_seconds=50.0, off_seconds=20.0)  # fmt: skip
    slots, trace, connected = Slots(concurrency=5, seed=seed, fleet=fleet), [], list(range(30))
    while len(trace) < 200:
        for partition in slots.draw(connected):
            slots.start(partition, 0, steps=10, bytes_down=10_000, bytes_up=10_000, sent=[])
        job = slots.upcoming(connected)
        if job is None:
            continue
        slots.finish(job)
        trace.append((job.number, job.partition, job.timing.ends_at))
    return trace


def test_the_virtual_clock_orders_jobs_by_their_end_and_one_seed_gives_one_order():
    trace = _slot_trace(5)
    ends = [end for _, _, end in trace]
    assert ends == sorted(ends)
    assert trace == _slot_trace(5) and trace != _slot_trace(6)
    assert len({p for _, p, _ in trace}) > 15  # the slots reach most devices, as they come and go


# ---------------------------------------------------------------- least squares: the limits against closed forms

def _least_squares(num: int, dim: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    features = [rng.normal(size=(20, dim)) for _ in range(num)]
    optima = [rng.normal(loc=3.0 * (k % 2), size=dim) for k in range(num)]  # two camps of devices
    targets = [a @ w for a, w in zip(features, optima, strict=True)]
    return features, targets


def _weighted_optimum(features, targets, weights) -> np.ndarray:
    hessian = sum(w * a.T @ a / len(a) for w, a in zip(weights, features, strict=True))
    moment = sum(w * a.T @ b / len(a) for w, a, b in zip(weights, features, targets, strict=True))
    return np.linalg.solve(hessian, moment)


def _buffered_least_squares(correction: str, *, updates: int = 6000, mu: float = 0.01):
    """FedBuff on least squares, the odd devices 8x slower: the iterate at the end and the measured shares."""
    num, dim = 8, 3
    features, targets = _least_squares(num, dim, 0)
    fleet = FleetModel(step_seconds={k: 0.1 * (8.0 if k % 2 else 1.0) for k in range(num)},
                       bandwidth=dict.fromkeys(range(num), 1e9),
                       availability={k: Availability() for k in range(num)})  # fmt: skip
    slots, participation = Slots(concurrency=4, seed=1, fleet=fleet), Participation(partitions=list(range(num)),
                                                                                   correction=correction)
    w, version, buffer, tail = np.zeros(dim), 0, [], []
    while version < updates:
        for k in slots.draw(list(range(num))):
            slots.start(k, version, steps=2, bytes_down=0, bytes_up=0, sent=[w.copy()])
        job = slots.upcoming(list(range(num)))
        slots.finish(job)
        k, start = job.partition, job.sent[0]
        local = start.copy()
        for _ in range(2):
            local -= mu * features[k].T @ (features[k] @ local - targets[k]) / len(features[k])
        tau = version - job.version
        weight = staleness_weight(tau) * participation.weight(k)
        participation.add(k, tau, weight=staleness_weight(tau))
        buffer.append(weight * (local - start))
        if len(buffer) == 2:
            w, version, buffer = w + np.mean(buffer, axis=0), version + 1, []
            if version > updates // 2:
                tail.append(w)
    return np.mean(tail, axis=0), participation, features, targets


def test_buffered_least_squares_goes_to_the_participation_weighted_optimum_and_the_correction_to_the_uniform_one():
    w, participation, features, targets = _buffered_least_squares("none")
    shares = participation.effective_shares()
    biased = _weighted_optimum(features, targets, list(shares.values()))
    uniform = _weighted_optimum(features, targets, [1.0] * 8)
    assert shares[0] > 2 * shares[1]  # the fast devices' updates dominate
    assert np.linalg.norm(w - biased) < 0.1 * np.linalg.norm(biased - uniform)
    corrected, _, _, _ = _buffered_least_squares("inverse-participation")
    assert np.linalg.norm(corrected - uniform) < 0.1 * np.linalg.norm(biased - uniform)


def _async_diffusion_least_squares(correction: str, *, updates: int = 16000, mu: float = 0.02):
    """Asynchronous diffusion on least squares, a ring of 8 agents, the odd ones 8x slower, one agent per update.

    A finished agent combines at once with the latest models of its neighbours (Metropolis
    weights, every neighbour kept), as the buffered pace plays ``diffusion`` with B = 1.
    """
    num, dim = 8, 3
    features, targets = _least_squares(num, dim, 1)
    ring = np.zeros((num, num))
    for k in range(num):
        ring[k, k] = 1 / 3
        ring[(k + 1) % num, k] = ring[(k - 1) % num, k] = 1 / 3
    fleet = FleetModel(step_seconds={k: 0.1 * (8.0 if k % 2 else 1.0) for k in range(num)},
                       bandwidth=dict.fromkeys(range(num), 1e9),
                       availability={k: Availability() for k in range(num)})  # fmt: skip
    slots = Slots(concurrency=num, seed=2, fleet=fleet)
    participation = Participation(partitions=list(range(num)), correction=correction)
    agents, tail = np.zeros((num, dim)), []
    for update in range(updates):
        for k in slots.draw(list(range(num))):
            slots.start(k, update, steps=2, bytes_down=0, bytes_up=0, sent=[agents[k].copy()])
        job = slots.upcoming(list(range(num)))
        slots.finish(job)
        k, psi = job.partition, job.sent[0].copy()
        for _ in range(2):
            psi -= mu * participation.weight(k) * features[k].T @ (features[k] @ psi - targets[k]) / len(features[k])
        participation.add(k, 0)
        column = ring[:, k]
        agents[k] = column[k] * psi + sum(column[j] * agents[j] for j in range(num) if j != k and column[j])
        if update > updates // 2:
            tail.append(agents.mean(axis=0))
    return np.mean(tail, axis=0), participation, ring, features, targets


def test_asynchronous_diffusion_goes_to_the_seeds_limit_with_the_measured_participation():
    from strategies.methods.topology import expected_matrix, objective_weights

    w, participation, ring, features, targets = _async_diffusion_least_squares("none")
    shares = np.array(list(participation.shares().values()))
    assert shares[0] > 3 * shares[1]  # the fast agents finish far more often
    # the seed's w_o = argmin sum_k p_k q_k J_k, p the Perron vector of E[A_i] under the measured q
    seed = _weighted_optimum(features, targets, objective_weights(expected_matrix(ring, shares, np.ones((8, 8))),
                                                                  shares))  # fmt: skip
    uniform = _weighted_optimum(features, targets, [1.0] * 8)
    # on a doubly stochastic combination, p_k q_k is uniform whatever q is: an agent that finishes rarely is a
    # stubborn neighbour the others keep averaging with, which its rare steps exactly offset
    assert np.linalg.norm(seed - uniform) < 1e-9
    assert np.linalg.norm(w - seed) < 0.02 * np.linalg.norm(uniform)
    by_share = _weighted_optimum(features, targets, shares)  # where a buffered global model would go: far away
    assert np.linalg.norm(w - by_share) > 20 * np.linalg.norm(w - seed)
    corrected, _, _, _, _ = _async_diffusion_least_squares("inverse-participation")
    # scaling the slow agents' steps up (the correction) then biases the limit towards them
    assert np.linalg.norm(corrected - uniform) > 2 * np.linalg.norm(w - uniform)
