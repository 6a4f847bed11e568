"""McMahan's CNN trained with its SGD step written out: the serial engine's fast path.

Through autograd, a B = 10 step of the CNN pays for more than its kernels: the
graph, ``functional_call``'s parameter swaps, the memory-format copies of the
convolutions' weights and their backward, and one gradient tensor a parameter,
written by the backward and read again by the step. Here the forward and the
backward are the ATen kernels autograd would call for
McMahan's CNN (``models/mnist.py``; convolution, max pooling with its
indices, ReLU, addmm, log-softmax and NLL, and their backward functions), in
the same order, and every parameter takes its step as soon
as its gradient is known: the fully connected layers inside the pass that reads
their weights (:func:`fedforge.client.fused_sgd.linear_step`), the convolutions right
after their backward. The arithmetic is :func:`fedforge.client.runtime.local_sgd`'s for
plain SGD, so both agree to 1e-12 in float64 (tests/test_cnn_step.py) and the
engines' float64 equivalence holds through it.

``precision: bf16`` computes what autocast would (precision.py): convolutions,
pooling, the fully connected layers' forward and input gradients in bf16, on
bf16 copies of the fp32 weights, the loss in fp32, each gradient cast to fp32
by the master weights' step; except that the fully connected layers' weight
and bias gradients are computed in fp32 from their bf16 operands (fused_sgd.py),
where autocast rounds them to bf16, and that fc1's weight steps are deferred
(deferred_sgd.py: added in 8 steps at a time, each forward and input gradient
seeing the earlier ones through bf16 products on their factors). Without
autocast's per-operator dispatch and casts.

It is a CPU path (oneDNN's inner product, channels_last convolutions, blocks
sized to a core's cache): a model on another device takes autograd. It applies
to plain SGD (no momentum, weight decay, clipping, hook or client
state), the cross-entropy loss, fp32 or float64 parameters, and an unmodified
model that declares this step as its fused kernel (``fused_kernel()`` returns
"mcmahan_cnn", as ``MnistCNN`` does), with exactly its layers and no module
hooks, computed channels_last: :func:`applies` decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from fedforge.algorithms.base import LocalPlan, LossFn, cross_entropy
from fedforge.client.deferred_sgd import DeferredLinear
from fedforge.client.fused_sgd import linear_step
from fedforge.core import rows
from fedforge.core.device import module_device
from fedforge.models.kernels import CNN_KERNEL
from fedforge.models.layout import CHANNELS_LAST, Conv2d

aten = torch.ops.aten
_POOL = ([2, 2], [2, 2])  # kernel, stride of the CNN's 2x2 max pooling
# The products' precisions in which fc1's weight steps are deferred: bf16 only
# (in fp32 the step is already one product into the weights, linear_step, and
# deferring measured no faster; tests add float64 to check the arithmetic).
DEFERRED = frozenset({torch.bfloat16})


def applies(
    model: nn.Module,
    plan: LocalPlan,
    loss_fn: LossFn,
    hook: object,
    state: Mapping[str, torch.Tensor] | None,
    dtype: torch.dtype,
) -> bool:
    """True when the written-out step computes what autograd would here."""
    if module_device(model).type != "cpu":  # CPU kernels
        return False
    if not declares_kernel(model) or hook is not None or state or not plan.plain:
        return False
    if loss_fn is not cross_entropy or dtype not in (torch.float32, torch.float64):
        return False
    if plan.precision == "bf16" and dtype != torch.float32:
        return False
    if any(_hooked(m) for m in model.modules()):  # a hook may change what it computes
        return False
    if not all(p.requires_grad for p in model.parameters()):  # frozen: never moves
        return False
    convs = [m for m in model.modules() if isinstance(m, Conv2d)]
    return len(convs) == 2 and all(m.channels_last and _as_built(m) for m in convs)


_SHAPES = {  # the layers the kernels assume, by parameter name (C: the classes)
    "conv1.weight": (32, 1, 5, 5),
    "conv1.bias": (32,),
    "conv2.weight": (64, 32, 5, 5),
    "conv2.bias": (64,),
    "fc1.weight": (512, 64 * 7 * 7),
    "fc1.bias": (512,),
}


def declares_kernel(model: nn.Module) -> bool:
    """Whether ``model``'s own class declares this written-out step as its fused
    kernel and the model has exactly the parameters it assumes. A declaration is
    not inherited: a subclass may change the forward it promised."""
    declared = type(model).__dict__.get("fused_kernel")
    if declared is None or declared(model) != CNN_KERNEL:
        return False
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    classes = shapes.get("fc2.weight", (0, 0))[0]
    expected = {**_SHAPES, "fc2.weight": (classes, 512), "fc2.bias": (classes,)}
    return classes > 0 and shapes == expected


def _hooked(module: nn.Module) -> bool:
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return any(getattr(module, h, None) for h in hooks)


def _as_built(conv: Conv2d) -> bool:
    """The convolution is the one McMahan's CNN builds (the kernels below assume it)."""
    shape = (conv.kernel_size, conv.stride, conv.padding, conv.dilation, conv.groups)
    built = shape == ((5, 5), (1, 1), (2, 2), (1, 1), 1) and conv.padding_mode == "zeros"
    return built and conv.bias is not None


class _Conv:
    """One of the CNN's convolutions: its forward, and its backward with the step."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, half: torch.dtype | None) -> None:
        self.weight, self.bias, self.half = weight, bias, half

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The convolution (padding 2, as the model's), and the input and weight
        it used (cast to bf16 under ``half``, as autocast would)."""
        w = self.weight.to(memory_format=CHANNELS_LAST)
        b = self.bias
        if self.half is not None:
            x, w, b = x.to(self.half), w.to(self.half), b.to(self.half)
        return aten.convolution(x, w, b, [1, 1], [2, 2], [1, 1], False, [0, 0], 1), x, w

    def backward_step(
        self, grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor, lr: float, want_input: bool
    ) -> torch.Tensor | None:
        """The input gradient (with the weights before the step), then the step."""
        grad_x, grad_w, grad_b = aten.convolution_backward(
            grad, x, w, [w.shape[0]], [1, 1], [2, 2], [1, 1], False, [0, 0], 1,
            [want_input, True, True],
        )  # fmt: skip
        self.weight.add_(grad_w, alpha=-lr)
        self.bias.add_(grad_b, alpha=-lr)
        return grad_x


def _pool_relu(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """2x2 max pooling then ReLU (the model's order): the activation and indices."""
    pooled, indices = aten.max_pool2d_with_indices(a, *_POOL)
    return pooled.relu_(), indices


def _pool_backward(grad: torch.Tensor, a: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The pooling's backward: ``grad`` to the window maxima of ``a``, zero elsewhere."""
    return aten.max_pool2d_with_indices_backward(grad, a, *_POOL, [0, 0], [1, 1], False, indices)


_Dense = tuple[torch.Tensor, torch.Tensor]  # a fully connected layer's (weight, bias)


def _layers(
    views: Mapping[str, torch.Tensor], plan: LocalPlan
) -> tuple[_Conv, _Conv, _Dense, _Dense, torch.Tensor | None, DeferredLinear | None]:
    """The CNN's layers on the parameter ``views``: the two convolutions, fc1 and
    fc2, fc2's bf16 weights under bf16 (else None), and fc1's deferred steps
    when its products' precision defers them (else None)."""
    half = torch.bfloat16 if plan.precision == "bf16" else None
    conv1 = _Conv(views["conv1.weight"], views["conv1.bias"], half)
    conv2 = _Conv(views["conv2.weight"], views["conv2.bias"], half)
    fc1 = (views["fc1.weight"], views["fc1.bias"])
    fc2 = (views["fc2.weight"], views["fc2.bias"])
    # Under bf16, fc1's weight steps are deferred (deferred_sgd.py): at B = 10 its
    # fp32 weights' traffic, not its products, is what a step pays for; fc2 keeps
    # a bf16 copy of its weights, kept equal to their rounding by every step
    # (linear_step), where autocast casts anew each time.
    products = fc1[0].dtype if half is None else half
    deferred = DeferredLinear(*fc1, plan.lr, products) if products in DEFERRED else None
    fc2_half = None if half is None else fc2[0].to(half)
    return conv1, conv2, fc1, fc2, fc2_half, deferred


def cnn_sgd(
    views: Mapping[str, torch.Tensor],
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: LocalPlan,
    batches: Callable[[], list[torch.Tensor]],
) -> tuple[float, int, int]:
    """``plan.local_epochs`` epochs of plain SGD on the CNN whose parameters are
    ``views`` (updated in place), minibatches from ``batches`` (one call an
    epoch): the summed loss, the examples seen and the steps taken."""
    conv1, conv2, fc1, fc2, fc2_half, deferred = _layers(views, plan)
    dtype, lr = fc1[0].dtype, plan.lr
    total, seen, steps = 0.0, 0, 0
    for _ in range(plan.local_epochs):
        for idx in batches():
            y = rows.take(y_all, idx)
            a1, x, w1 = conv1.forward(rows.take(x_all, idx).to(memory_format=CHANNELS_LAST))
            r1, i1 = _pool_relu(a1)
            a2, _, w2 = conv2.forward(r1)
            r2, i2 = _pool_relu(a2)
            f = r2.flatten(start_dim=1)
            h = (_linear(f, *fc1, None) if deferred is None else deferred.forward(f)).relu_()
            logits = _linear(h, *fc2, fc2_half)
            # The loss of each example, then their mean, as client.local_sgd takes
            # it (a label -100 counts as a zero loss there, not as no example).
            log_p = torch.log_softmax(logits.to(dtype), dim=1)
            losses, total_weight = aten.nll_loss_forward(log_p, y, None, 0, -100)
            mean = torch.full_like(losses, 1.0 / len(y))
            grad = aten.nll_loss_backward(mean, log_p, y, None, 0, -100, total_weight)
            grad = aten._log_softmax_backward_data(grad, log_p, 1, dtype).to(h.dtype)
            grad = linear_step(h, grad, *fc2, lr, True, fc2_half)
            grad = aten.threshold_backward(grad, h, 0)
            if deferred is None:
                grad = linear_step(f, grad, *fc1, lr, True)
            else:
                grad = deferred.backward_step(f, grad, True)
            # The second ReLU's mask from fc1's input (r2's values in the gradient's
            # layout), then pooling's backward in channels_last, as its input:
            # mixed layouts take slow paths in both kernels.
            grad = aten.threshold_backward(grad, f, 0).view(r2.shape)
            grad = grad.contiguous(memory_format=CHANNELS_LAST)
            grad = conv2.backward_step(_pool_backward(grad, a2, i2), r1, w2, lr, True)
            grad = _pool_backward(aten.threshold_backward(grad, r1, 0), a1, i1)
            conv1.backward_step(grad, x, w1, lr, False)
            total += losses.mean().item() * len(idx)
            seen += len(idx)
            steps += 1
    if deferred is not None:
        deferred.fold()
    return total, seen, steps


def _linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, half: torch.Tensor | None
) -> torch.Tensor:
    """``x W^T + b``, on the bf16 copy ``half`` of the weights if given."""
    if half is None:
        return torch.addmm(bias, x, weight.t())
    return torch.addmm(bias.to(half.dtype), x, half.t())
