"""Per-FedAvg's meta-gradients against closed forms and independent computations."""

import numpy as np
import pytest
import torch
from conftest import settings
from torch.func import functional_call, grad, jvp
from torch.nn import functional as F

from clients.losses import model_loss
from clients.meta import finite_difference_hvp, hessian_vector_product, meta_gradient
from clients.models import build_model
from clients.perfedavg import PerFedAvgClient
from datasets import ClientData

ALPHA = 0.1


def quadratic(seed=0, dim=5):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(dim, dim))
    q = a @ a.T / dim + np.eye(dim)
    b = rng.normal(size=dim)
    w = rng.normal(size=dim)
    q_t, b_t = torch.tensor(q), torch.tensor(b)

    def loss(params, batch):
        (v,) = params
        return 0.5 * v @ q_t @ v - b_t @ v

    return loss, q, b, w


@pytest.mark.parametrize("variant", ["fo", "hf", "so"])
def test_quadratic_closed_forms(variant):
    loss, q, b, w = quadratic()
    grad_f = lambda v: q @ v - b  # noqa: E731
    outer = grad_f(w - ALPHA * grad_f(w))
    expected = {"fo": outer, "hf": (np.eye(len(w)) - ALPHA * q) @ outer, "so": (np.eye(len(w)) - ALPHA * q) @ outer}
    step = meta_gradient(loss, (torch.tensor(w),), (None, None, None), alpha=ALPHA, variant=variant, delta=1e-3)
    np.testing.assert_allclose(step.direction[0].numpy(), expected[variant], rtol=1e-10, atol=1e-10)
    assert (step.grad_evals, step.hvp_evals) == {"fo": (2, 0), "hf": (4, 0), "so": (2, 1)}[variant]


def test_hvp_is_exact_and_central_difference_is_exact_on_a_quadratic():
    loss, q, _, w = quadratic(seed=1)
    v = np.random.default_rng(2).normal(size=len(w))
    exact = hessian_vector_product(loss, (torch.tensor(w),), (torch.tensor(v),), None)[0].numpy()
    np.testing.assert_allclose(exact, q @ v, rtol=1e-12)
    for delta in (1e-1, 1e-3, 1e-5):
        fd = finite_difference_hvp(loss, (torch.tensor(w),), (torch.tensor(v),), None, delta)[0].numpy()
        np.testing.assert_allclose(fd, q @ v, rtol=1e-8, atol=1e-8)


def mlp_setup(dtype=torch.float64, seed=0):
    model = build_model("mlp", input_shape=(1, 6, 6), num_classes=4, seed=seed).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    batches = tuple((torch.randn(12, 1, 6, 6, generator=gen, dtype=dtype), torch.randint(0, 4, (12,), generator=gen))
                    for _ in range(3))  # fmt: skip
    params = tuple(p.detach() for p in model.parameters())
    return model, batches, params


def test_so_on_the_mlp_matches_an_independent_forward_over_reverse_reference():
    model, batches, params = mlp_setup()
    names = [n for n, _ in model.named_parameters()]

    def loss_dict(p, batch):
        return F.cross_entropy(functional_call(model, p, (batch[0],)), batch[1])

    p0 = dict(zip(names, params, strict=True))
    g_inner = grad(loss_dict)(p0, batches[0])
    adapted = {k: p0[k] - ALPHA * g_inner[k] for k in names}
    g_outer = grad(loss_dict)(adapted, batches[1])
    _, hv = jvp(lambda p: grad(loss_dict)(p, batches[2]), (p0,), (g_outer,))  # torch.func, not double backward
    reference = [g_outer[k] - ALPHA * hv[k] for k in names]
    step = meta_gradient(model_loss(model), params, batches, alpha=ALPHA, variant="so")
    for got, want in zip(step.direction, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_hvp_matches_a_materialised_hessian_on_logistic_regression():
    model = build_model("logreg", input_shape=(7,), num_classes=3, seed=1).double()
    gen = torch.Generator().manual_seed(4)
    batches = [(torch.randn(9, 7, generator=gen, dtype=torch.float64), torch.randint(0, 3, (9,), generator=gen))] * 3
    params = tuple(p.detach() for p in model.parameters())
    loss = model_loss(model)
    flat = torch.cat([p.reshape(-1) for p in params])
    shapes = [p.shape for p in params]

    def unflatten(vec):
        out, start = [], 0
        for shape in shapes:
            size = int(np.prod(shape))
            out.append(vec[start : start + size].reshape(shape))
            start += size
        return tuple(out)

    hessian = torch.autograd.functional.hessian(lambda v: loss(unflatten(v), batches[2]), flat)
    vector = torch.randn(flat.shape, dtype=flat.dtype, generator=torch.Generator().manual_seed(5))
    got = torch.cat([h.reshape(-1) for h in hessian_vector_product(loss, params, unflatten(vector), batches[2])])
    torch.testing.assert_close(got, hessian @ vector, rtol=1e-9, atol=1e-12)


def test_hf_approaches_so_as_delta_shrinks_then_rounding_takes_over():
    model, batches, params = mlp_setup(torch.float64)
    so = meta_gradient(model_loss(model), params, batches, alpha=ALPHA, variant="so").direction

    def error(delta, model, batches, params, reference):
        hf = meta_gradient(model_loss(model), params, batches, alpha=ALPHA, variant="hf", delta=delta).direction
        return float(sum(((a - b) ** 2).sum() for a, b in zip(hf, reference, strict=True)).sqrt())

    errors = [error(d, model, batches, params, so) for d in (1e-1, 1e-2, 1e-3, 1e-4)]
    assert all(a > 10 * b for a, b in zip(errors, errors[1:], strict=False)), errors  # O(delta^2) truncation
    assert errors[-1] < 1e-8
    # in float32 the difference of two nearly equal gradients loses digits as delta shrinks
    model32, batches32, params32 = mlp_setup(torch.float32)
    so32 = meta_gradient(model_loss(model32), params32, batches32, alpha=ALPHA, variant="so").direction
    err32 = {d: error(d, model32, batches32, params32, so32) for d in (1e-2, 1e-6)}
    assert err32[1e-6] > 10 * err32[1e-2], err32


def softmax_grads(w, b, x, y):
    z = x @ w.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    r = p.copy()
    r[np.arange(len(y)), y] -= 1.0
    return r.T @ x / len(y), r.mean(0), p


def softmax_hvp(w, b, x, y, dw, db):
    _, _, p = softmax_grads(w, b, x, y)
    dz = x @ dw.T + db
    hz = p * dz - p * (p * dz).sum(1, keepdims=True)
    return hz.T @ x / len(y), hz.mean(0)


@pytest.mark.parametrize("variant", ["fo", "hf", "so"])
def test_one_local_step_on_a_linear_model_matches_a_hand_computation(variant):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 2)).astype(np.float32)
    y = rng.integers(0, 2, 6)
    w0 = np.array([[0.3, -0.2], [0.1, 0.4]])
    b0 = np.array([0.05, -0.05])
    alpha, beta, delta = 0.3, 0.2, 1e-2
    # hand computation (numpy, float64): every batch is the whole set, as the client draws them below
    gw, gb, _ = softmax_grads(w0, b0, x, y)
    ow, ob, _ = softmax_grads(w0 - alpha * gw, b0 - alpha * gb, x, y)
    if variant == "fo":
        dw, db = ow, ob
    elif variant == "so":
        hw, hb = softmax_hvp(w0, b0, x, y, ow, ob)
        dw, db = ow - alpha * hw, ob - alpha * hb
    else:
        pw, pb, _ = softmax_grads(w0 + delta * ow, b0 + delta * ob, x, y)
        mw, mb, _ = softmax_grads(w0 - delta * ow, b0 - delta * ob, x, y)
        dw, db = ow - alpha * (pw - mw) / (2 * delta), ob - alpha * (pb - mb) / (2 * delta)
    expected = (w0 - beta * dw, b0 - beta * db)

    data = ClientData(x, y.astype(np.int64), x, y.astype(np.int64), num_classes=2)
    run = settings(perfedavg_alpha=alpha, perfedavg_beta=beta, perfedavg_delta=delta, perfedavg_variant=variant,
                   local_steps=1, batch_size=6, perfedavg_outer_batch_size=6, perfedavg_hessian_batch_size=6,
                   device="cpu", model="logreg")  # fmt: skip
    client = PerFedAvgClient(model=build_model("logreg", input_shape=(2,), num_classes=2), data=data, settings=run,
                             partition_id=0)  # fmt: skip
    params, n, metrics = client.fit([w0.astype(np.float32), b0.astype(np.float32)], {"server-round": 1})
    np.testing.assert_allclose(params[0], expected[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(params[1], expected[1], rtol=1e-4, atol=1e-5)
    assert n == 6 and metrics["grad-evals"] == {"fo": 2, "hf": 4, "so": 2}[variant]
    assert metrics["hvp-evals"] == (1 if variant == "so" else 0)
    assert metrics["sample-grads"] == {"fo": 12, "hf": 24, "so": 18}[variant]


def small_client(**overrides):
    data = ClientData(np.arange(10, dtype=np.float32).reshape(5, 2), np.array([0, 1, 0, 1, 1]),
                      np.zeros((2, 2), np.float32), np.zeros(2, np.int64), num_classes=2)  # fmt: skip
    run = settings(**{"batch_size": 5, "perfedavg_outer_batch_size": 6, "device": "cpu", "model": "logreg",
                      "local_steps": 1, **overrides})  # fmt: skip
    return PerFedAvgClient(model=build_model("logreg", input_shape=(2,), num_classes=2), data=data, settings=run,
                           partition_id=0)  # fmt: skip


@pytest.mark.parametrize(("variant", "epochs", "steps"), [("fo", 1.0, 3), ("hf", 1.0, 2), ("fo", 2.0, 6)])
def test_local_epochs_count_the_batches_a_meta_update_reads(variant, epochs, steps):
    # 50 examples; fo reads D and D' (20 a step: 3 steps a pass), hf also D'' (30 a step: 2 a pass)
    x = np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32)
    data = ClientData(x, (x[:, 0] > 0).astype(np.int64), x, (x[:, 0] > 0).astype(np.int64), num_classes=2)
    run = settings(perfedavg_variant=variant, local_steps=11, local_epochs=epochs, batch_size=10, device="cpu",
                   model="logreg")  # fmt: skip
    client = PerFedAvgClient(model=build_model("logreg", input_shape=(2,), num_classes=2), data=data, settings=run,
                             partition_id=0)  # fmt: skip
    _, _, metrics = client.fit(client.get_parameters({}), {"server-round": 1})
    assert metrics["local-steps"] == steps


def test_batches_larger_than_the_data_take_all_of_it_and_are_counted():
    # D, D', D'' of 5, 6 and 10 on 5 examples: every batch is the whole set, so the step is the full-batch
    # meta-gradient, the same as with sizes 5, 5, 5 (whose batches are the whole set too)
    start = small_client().get_parameters({})
    big = small_client(perfedavg_hessian_batch_size=10)
    params, _, metrics = big.fit([a.copy() for a in start], {"server-round": 1})
    exact, _, exact_metrics = small_client(perfedavg_outer_batch_size=5, perfedavg_hessian_batch_size=5).fit(
        [a.copy() for a in start], {"server-round": 1})
    for ours, theirs in zip(params, exact, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    assert metrics["small-batch"] == 1 and exact_metrics["small-batch"] == 0
    assert metrics["sample-grads"] == 5 + 5 + 2 * 5  # hf: D, D' and D'' twice, each of the 5 examples
    assert "preflight-error" not in big.get_properties({"perfedavg-outer-batch-size": 40})


def test_strict_batches_refuses_batches_larger_than_the_data_before_training():
    client = small_client(strict_batches=True)
    before = client.get_parameters({})
    with pytest.raises(ValueError, match=r"perfedavg-outer-batch-size 6 must be in \[1, 5\]"):
        client.fit(before, {})
    # the preflight's question is answered as data, not raised (Flower would print a traceback per client)
    answer = client.get_properties({"perfedavg-outer-batch-size": 5, "perfedavg-hessian-batch-size": 9})
    assert answer["preflight-error"].startswith("perfedavg-hessian-batch-size 9 must be in [1, 5]")
    assert answer["partition-id"] == 0 and "Traceback" in answer["preflight-detail"]
    assert answer["preflight-scope"] == "run"  # a partition of the run's data: the run's config is at fault
    fine = client.get_properties({"perfedavg-outer-batch-size": 5, "perfedavg-hessian-batch-size": 5})
    assert fine["num-train"] == 5 and fine["train-classes"] == "0:2 1:3" and "preflight-error" not in fine


def test_unknown_variant_in_meta_gradient():
    loss, _, _, w = quadratic()
    with pytest.raises(ValueError, match="variant 'x' is not one of"):
        meta_gradient(loss, (torch.tensor(w),), (None, None, None), alpha=0.1, variant="x")


def test_relative_delta_perturbs_by_delta_in_length_and_stays_exact_on_a_quadratic():
    loss, q, _, w = quadratic(seed=3)
    v = 1e3 * np.random.default_rng(4).normal(size=len(w))  # a large outer gradient
    for relative in (False, True):
        fd = finite_difference_hvp(loss, (torch.tensor(w),), (torch.tensor(v),), None, 1e-3, relative=relative)[0]
        np.testing.assert_allclose(fd.numpy(), q @ v, rtol=1e-6)
    seen = []

    def recording(params, batch):
        seen.append(params[0].detach().clone())
        return (params[0] ** 2).sum()

    finite_difference_hvp(recording, (torch.tensor(w),), (torch.tensor(v),), None, 1e-3, relative=True)
    assert float(torch.linalg.norm(seen[0] - seen[1])) == pytest.approx(2e-3)  # w + d v/|v| and w - d v/|v|
    seen.clear()
    finite_difference_hvp(recording, (torch.tensor(w),), (torch.tensor(v),), None, 1e-3)
    assert float(torch.linalg.norm(seen[0] - seen[1])) == pytest.approx(2e-3 * np.linalg.norm(v))


@pytest.mark.parametrize("variant", ["hf", "so"])
def test_a_curvature_bound_scales_the_correction_to_rho_times_g_on_a_quadratic(variant):
    loss, q, b, w = quadratic(seed=3)
    grad_f = lambda v: q @ v - b  # noqa: E731
    alpha = 0.5  # a large inner step, so that alpha * Q g is comparable to g
    outer = grad_f(w - alpha * grad_f(w))
    correction = alpha * q @ outer
    ratio = np.linalg.norm(correction) / np.linalg.norm(outer)
    for rho in (0.5 * ratio, 2.0 * ratio):  # the bound binds, then it does not
        step = meta_gradient(loss, (torch.tensor(w),), (None, None, None), alpha=alpha, variant=variant,
                             delta=1e-3, curvature_bound=rho)  # fmt: skip
        scale = min(1.0, rho / ratio)
        np.testing.assert_allclose(step.direction[0].numpy(), outer - scale * correction, rtol=1e-9, atol=1e-9)
    unbounded = meta_gradient(loss, (torch.tensor(w),), (None, None, None), alpha=alpha, variant=variant, delta=1e-3)
    np.testing.assert_allclose(unbounded.direction[0].numpy(), outer - correction, rtol=1e-9, atol=1e-9)


def test_a_curvature_bound_leaves_fo_as_it_is():
    loss, q, b, w = quadratic(seed=3)
    bounded = meta_gradient(loss, (torch.tensor(w),), (None, None, None), alpha=0.5, variant="fo",
                            curvature_bound=1e-6)  # fmt: skip
    plain = meta_gradient(loss, (torch.tensor(w),), (None, None, None), alpha=0.5, variant="fo")
    assert torch.equal(bounded.direction[0], plain.direction[0])


def test_the_default_curvature_bound_is_0_3_for_so_on_a_relu_model_and_off_elsewhere():
    def bound(**keys):
        run = settings(strategy="perfedavg", **keys)
        return run.method.curvature_bound_on(run.model_card.smooth)

    assert bound(perfedavg_variant="so", model="cnn-small") == 0.3
    assert bound(perfedavg_variant="so", model="cnn") == 0.3
    assert bound(perfedavg_variant="so", model="mlp") == 0.0  # the paper's estimator where it is exact
    assert bound(perfedavg_variant="hf", model="cnn-small") == 0.0  # hf on ReLU is warned against instead
    assert bound(perfedavg_variant="so", model="cnn-small", perfedavg_curvature_bound=0.0) == 0.0
    assert bound(perfedavg_variant="so", model="mlp", perfedavg_curvature_bound=0.5) == 0.5


def test_a_curvature_bound_between_minus_one_and_zero_is_refused_naming_the_key():
    from app.config import ConfigError

    with pytest.raises(ConfigError, match="'perfedavg-curvature-bound': -0.5 is neither -1"):
        settings(strategy="perfedavg", perfedavg_curvature_bound=-0.5)


def test_the_client_steps_with_the_bound_in_force(monkeypatch):
    import clients.perfedavg as module

    seen = []
    real = module.meta_direction

    def spy(**kwargs):
        seen.append(kwargs["curvature_bound"])
        return real(**kwargs)

    monkeypatch.setattr(module, "meta_direction", spy)
    client = small_client(perfedavg_variant="so", perfedavg_curvature_bound=0.25)
    client.fit(client.get_parameters({}), {"server-round": 1})
    client = small_client(perfedavg_variant="so")  # the default on logreg (not ReLU): the paper's estimator
    client.fit(client.get_parameters({}), {"server-round": 1})
    assert seen == [0.25, 0.0]
