"""The one local training loop and its hooks, against hand computations."""

import numpy as np
import pytest
import torch

from clients.losses import gradient, model_loss, proximal_term
from clients.models import build_model
from clients.training import train_steps
from strategies.contracts.keys import key_name


def least_squares(seed=0, n=12, d=3):
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.normal(size=(n, d)), dtype=torch.float64)
    y = torch.tensor(rng.normal(size=n), dtype=torch.float64)
    model = build_model("linear", input_shape=(d,), num_classes=0, seed=seed).double()
    return model, x, y


def test_proximal_term_has_the_closed_form_gradient():
    w = (torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([[0.5]], dtype=torch.float64))
    anchor = (torch.tensor([0.0, 1.0], dtype=torch.float64), torch.tensor([[2.0]], dtype=torch.float64))
    term = proximal_term(anchor, 0.3)
    assert float(term(w)) == 0.15 * (1 + 9 + 2.25)
    leaves = tuple(p.clone().requires_grad_(True) for p in w)
    grads = torch.autograd.grad(term(leaves), leaves)
    for g, p, a in zip(grads, w, anchor, strict=True):
        torch.testing.assert_close(g, 0.3 * (p - a), rtol=0, atol=0)


def test_two_steps_with_an_extra_loss_match_the_hand_computation():
    model, x, y = least_squares()
    w0 = next(model.parameters()).detach().clone().reshape(-1).numpy()
    anchor = np.array([0.5, -0.5, 1.0])
    lr, mu = 0.1, 0.7
    seen = []
    report = train_steps(model, [(x, y), (x, y)], lr, on_step=seen.append,
                         extra_loss=proximal_term((torch.tensor(anchor).reshape(1, 3),), mu))  # fmt: skip
    xs, ys = x.numpy(), y.numpy()
    w = w0.copy()
    for _ in range(2):  # task loss: mean of half squared errors
        w = w - lr * (xs.T @ (xs @ w - ys) / len(ys) + mu * (w - anchor))
    np.testing.assert_allclose(next(model.parameters()).detach().reshape(-1).numpy(), w, rtol=1e-12)
    # the reported loss is the task's alone, at the two starting points
    first = 0.5 * np.mean((xs @ w0 - ys) ** 2)
    assert seen[0].loss == pytest.approx(first, rel=1e-12)
    assert report.steps == 2 and report.grad_evals == 2 and report.sample_grads == 24
    assert len(seen) == 2 and seen[1].direction[0].shape == (1, 3)


def test_gradient_leaves_its_inputs_alone():
    model, x, y = least_squares()
    params = tuple(p.detach() for p in model.parameters())
    before = [p.clone() for p in params]
    gradient(model_loss(model), params, (x, y), proximal_term(params, 1.0))
    for p, b in zip(params, before, strict=True):
        assert torch.equal(p, b) and not p.requires_grad


def test_a_field_named_like_a_keyword_drops_its_underscore():
    assert key_name("ditto", "lambda_") == "ditto-lambda"
    assert key_name("", "local_steps") == "local-steps"


def test_a_batch_term_sees_the_batch_the_output_and_the_representation_of_the_same_pass():
    # least squares (representation: the input itself, output: x w) plus lam/2 mean(output^2) + c * sum(z * y):
    # the second term's gradient is 0 (z is the input, not a function of w); the first adds lam X^T X w / n
    model, x, y = least_squares(seed=1)
    w0 = next(model.parameters()).detach().clone().reshape(-1).numpy()
    lr, lam, seen, extra_seen = 0.2, 0.5, [], []

    def term(params, batch, forward):
        bx, by = batch
        assert forward.features.shape == bx.shape and torch.equal(forward.features, bx)
        out = forward.output.detach().reshape(-1)
        extra_seen.append(float(out @ out))
        return 0.5 * lam * (forward.output**2).mean() + 3.0 * (forward.features * by[:, None]).sum()

    train_steps(model, [(x, y), (x, y)], lr, batch_term=term, on_step=seen.append,
                extra_loss=proximal_term((torch.zeros(1, 3, dtype=torch.float64),), 0.1))  # fmt: skip
    xs, ys = x.numpy(), y.numpy()
    w, outputs = w0.copy(), []
    for _ in range(2):
        outputs.append(float((xs @ w) @ (xs @ w)))
        w = w - lr * (xs.T @ (xs @ w - ys) / len(ys) + lam * xs.T @ (xs @ w) / len(ys) + 0.1 * w)
    np.testing.assert_allclose(next(model.parameters()).detach().reshape(-1).numpy(), w, rtol=1e-12)
    np.testing.assert_allclose(extra_seen, outputs, rtol=1e-12)  # the term saw the pass at each step's parameters
    assert seen[0].loss == pytest.approx(0.5 * np.mean((xs @ w0 - ys) ** 2), rel=1e-12)  # the task's loss alone


def test_a_batch_term_is_refused_with_a_meta_direction():
    model, x, y = least_squares()
    with pytest.raises(ValueError, match="batch_term is added to SGD's loss"):
        train_steps(model, [(x, y)], 0.1, direction=lambda *a: None, batch_term=lambda p, b, f: 0)


def test_features_at_other_parameters_leaves_the_models_batchnorm_statistics_alone():
    from clients.losses import features_at

    model = build_model("fedavg-cnn-bn", input_shape=(1, 28, 28), num_classes=10, seed=0).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 1, 28, 28)
    values = [p.detach() * 2 for p in model.parameters()]
    z = features_at(model, values, x)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    doubled = build_model("fedavg-cnn-bn", input_shape=(1, 28, 28), num_classes=10, seed=0).train()
    with torch.no_grad():
        for p, v in zip(doubled.parameters(), values, strict=True):
            p.copy_(v)
        torch.testing.assert_close(z, doubled.features(x))
