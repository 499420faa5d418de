"""The one local training loop and its hooks, against hand computations."""

import numpy as np
import pytest
import torch

from clients.models import build_model
from clients.training import gradient, model_loss, proximal_term, train_steps
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
