"""Functional forward passes of a Sequential CNN (Conv2d, Linear, ReLU, MaxPool2d, Flatten):
what the batched executor calls instead of ``torch.func.functional_call``.

- :func:`pool_before_relu`: the same model with each ReLU that feeds a max-pool moved after it
  (exact, a quarter of the ReLU's work);
- :func:`direct_forward`: ``f(params, x)`` of one client, torch's functional ops called on the
  given parameters directly;
- :func:`grouped_forward`: ``f(stacked params, x)`` of K clients at once, each convolution one
  grouped convolution over the K clients' channel blocks and each linear layer one batched
  matrix product: a plain autograd graph of a dozen ops, what ``vmap`` builds with its batching
  rules, without its per-op interpretation on the host (optionally in channels-last layout);
- :func:`im2col_forward`: the same function with each convolution as im2col (``F.unfold``)
  and batched matrix products.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

#: A layer as the functional forwards see it: ("conv", first parameter index, has bias, stride,
#: padding, dilation, groups), ("linear", index, has bias), ("relu",), ("pool", kernel, stride,
#: padding, dilation, ceil mode) or ("flatten", start dim, end dim).
Layer = tuple
#: ``f(params, x) -> logits``: what :func:`direct_forward` and :func:`grouped_forward` return
Forward = Callable[[list[torch.Tensor], torch.Tensor], torch.Tensor]


def pool_before_relu(model: nn.Module) -> nn.Module:
    """``model`` with every ``ReLU`` that feeds a ``MaxPool2d`` moved after it, sharing the
    parameters (same names); ``model`` itself when it is not an ``nn.Sequential`` or has no such
    pair.

    relu(maxpool(x)) = maxpool(relu(x)) exactly, and so are the gradients: where a window's
    maximum is positive both route the gradient to the same element, where it is not both give
    zero. The pooled tensor is a quarter of the size (2×2 pooling), so the ReLU and its backward
    cost a quarter.
    """
    if not isinstance(model, nn.Sequential):
        return model
    mods = list(model)
    swapped = False
    for i in range(len(mods) - 1):
        if isinstance(mods[i], nn.ReLU) and isinstance(mods[i + 1], nn.MaxPool2d):
            mods[i], mods[i + 1] = mods[i + 1], mods[i]
            swapped = True
    if not swapped:
        return model
    out = nn.Sequential(*mods)
    if [n for n, _ in out.named_parameters()] != [n for n, _ in model.named_parameters()]:
        return model  # a reordering that renames parameters is not the same model
    return out


def sequential_layers(model: nn.Module) -> list[Layer] | None:
    """The layers of ``model`` as :data:`Layer` tuples (parameters indexed in
    ``named_parameters`` order), or None when it is not an ``nn.Sequential`` of Conv2d
    (zero-padded), Linear, ReLU, MaxPool2d and Flatten layers holding all its parameters."""
    if not isinstance(model, nn.Sequential):
        return None
    layers: list[Layer] = []
    index = 0
    for mod in model:
        if isinstance(mod, nn.Conv2d) and mod.padding_mode == "zeros":
            has_bias = mod.bias is not None
            layers.append(("conv", index, has_bias, mod.stride, mod.padding, mod.dilation,
                           mod.groups))
            index += 2 if has_bias else 1
        elif isinstance(mod, nn.Linear):
            has_bias = mod.bias is not None
            layers.append(("linear", index, has_bias))
            index += 2 if has_bias else 1
        elif isinstance(mod, nn.ReLU):
            layers.append(("relu",))
        elif isinstance(mod, nn.MaxPool2d) and not mod.return_indices:
            layers.append(("pool", mod.kernel_size, mod.stride, mod.padding, mod.dilation,
                           mod.ceil_mode))
        elif isinstance(mod, nn.Flatten):
            layers.append(("flatten", mod.start_dim, mod.end_dim))
        else:
            return None
    if index != len(list(model.parameters())):
        return None
    return layers


def direct_forward(model: nn.Module
                   ) -> Forward | None:
    """A forward function ``f(params, x)`` of ``model`` that calls torch's functional ops on the
    given parameters directly (``params``: tensors in ``named_parameters`` order), or None when
    ``model`` is not an ``nn.Sequential`` of Conv2d, Linear, ReLU, MaxPool2d and Flatten layers.

    It computes what ``functional_call(model, ...)`` computes, op for op, without swapping the
    module's parameters in and out on every call; :func:`torch.func.functional_call` stays the
    path for any other model.
    """
    layers = sequential_layers(model)
    if layers is None:
        return None

    def forward(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            kind = layer[0]
            if kind == "conv":
                _, i, has_bias, stride, padding, dilation, groups = layer
                x = F.conv2d(x, params[i], params[i + 1] if has_bias else None, stride, padding,
                             dilation, groups)
            elif kind == "linear":
                _, i, has_bias = layer
                x = F.linear(x, params[i], params[i + 1] if has_bias else None)
            elif kind == "relu":
                x = F.relu(x)
            elif kind == "pool":
                x = F.max_pool2d(x, *layer[1:])
            else:
                x = x.flatten(layer[1], layer[2])
        return x

    return forward


def _conv_then_linear(model: nn.Module) -> list[Layer] | None:
    """The layers of ``model`` (:func:`sequential_layers`) when they are convolutions, ReLUs and
    pools, one ``Flatten()`` and then linear layers and ReLUs; else None."""
    layers = sequential_layers(model)
    if layers is None:
        return None
    kinds = [layer[0] for layer in layers]
    if kinds.count("flatten") != 1:
        return None
    cut = kinds.index("flatten")
    if (layers[cut][1:] != (1, -1) or "linear" in kinds[:cut]
            or any(k in ("conv", "pool") for k in kinds[cut:])):
        return None
    return layers


def _linear(params: list[torch.Tensor], layer: Layer, x: torch.Tensor) -> torch.Tensor:
    """A linear layer of K clients at once: ``x`` [K, B, in] -> [K, B, out], one batched
    matrix product."""
    _, i, has_bias = layer
    wt = params[i].transpose(1, 2)
    return torch.baddbmm(params[i + 1].unsqueeze(1), x, wt) if has_bias else torch.bmm(x, wt)


def _run_layers(layers: list[Layer], params: list[torch.Tensor], x: torch.Tensor,
                conv: Callable[[Layer, torch.Tensor], torch.Tensor],
                flatten: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """K clients' layers in order: the convolutions and the flatten as the caller computes
    them, ReLUs and pools elementwise, linear layers as batched matrix products."""
    for layer in layers:
        kind = layer[0]
        if kind == "conv":
            x = conv(layer, x)
        elif kind == "linear":
            x = _linear(params, layer, x)
        elif kind == "relu":
            x = F.relu(x)
        elif kind == "pool":
            x = F.max_pool2d(x, *layer[1:])
        else:
            x = flatten(x)
    return x


def grouped_forward(model: nn.Module, *, channels_last: bool = False) -> Forward | None:
    """A forward function ``f(params, x)`` of K clients of ``model`` at once, or None where
    :func:`sequential_layers` refuses the model or its layers are not convolutions and pools
    followed by one ``Flatten()`` and linear layers.

    ``params``: each parameter stacked along a leading client axis ([K, ...], in
    ``named_parameters`` order); ``x``: the K clients' batches side by side on the channel axis,
    [B, K·C, H, W] (client k's channels are block k). Returns the logits as [K, B, classes].
    Client k's logits depend on its own parameters and batch only, so the gradient of a sum of
    per-client losses with respect to the stacked parameters is every client's own gradient.
    ``channels_last``: lay the input out channels-last first, so that the convolutions run in
    that layout (cuDNN's NHWC kernels); the same values either way.
    """
    layers = _conv_then_linear(model)
    if layers is None:
        return None

    def forward(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        k = params[0].shape[0]
        batch = x.shape[0]

        def conv(layer: Layer, x: torch.Tensor) -> torch.Tensor:
            _, i, has_bias, stride, padding, dilation, groups = layer
            w = params[i]
            return F.conv2d(x, w.reshape(-1, *w.shape[2:]),
                            params[i + 1].reshape(-1) if has_bias else None, stride, padding,
                            dilation, k * groups)

        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        # flatten: [B, K·C, h, w] -> [K, B, C·h·w], each client's block
        return _run_layers(layers, params, x, conv,
                           lambda x: x.reshape(batch, k, -1).transpose(0, 1))

    return forward


def im2col_forward(model: nn.Module) -> Forward | None:
    """:func:`grouped_forward`'s function (same arguments, same logits) with each convolution
    computed as im2col and matrix products instead of a grouped convolution: ``F.unfold`` cuts
    every client's image into its receptive fields ([K·B, C·kh·kw, L]) and one batched matrix
    product per (client, sample) applies the client's filters ([O, C·kh·kw]); autograd's
    backward of the same ops gives the weight gradient as matrix products too, where cuDNN's
    grouped weight gradient can be slow. The activations stay client-major, [K·B, C, H, W],
    between the layers. None where :func:`grouped_forward` refuses the model or a convolution
    is itself grouped."""
    layers = _conv_then_linear(model)
    if layers is None or any(layer[0] == "conv" and layer[6] != 1 for layer in layers):
        return None

    def forward(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        k = params[0].shape[0]
        batch = x.shape[0]

        def conv(layer: Layer, x: torch.Tensor) -> torch.Tensor:
            _, i, has_bias, stride, padding, dilation, _ = layer
            w = params[i]  # [K, O, C, kh, kw]
            o, kernel = w.shape[1], w.shape[3:]
            h_out, w_out = (
                (size + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1) // stride[d] + 1
                for d, size in enumerate(x.shape[2:]))
            cols = F.unfold(x, kernel, dilation, padding, stride)  # [K·B, C·kh·kw, L]
            cols = cols.view(k, batch, *cols.shape[1:])
            out = torch.matmul(w.reshape(k, 1, o, -1), cols)  # [K, B, O, L]
            if has_bias:
                out = out + params[i + 1].view(k, 1, o, 1)
            return out.reshape(k * batch, o, h_out, w_out)

        x = x.reshape(batch, k, -1, *x.shape[2:]).transpose(0, 1).reshape(
            k * batch, -1, *x.shape[2:])  # client-major: [K·B, C, H, W]
        # flatten: [K·B, C, h, w] -> [K, B, C·h·w]
        return _run_layers(layers, params, x, conv, lambda x: x.reshape(k, batch, -1))

    return forward


__all__ = ["Forward", "Layer", "direct_forward", "grouped_forward", "im2col_forward",
           "pool_before_relu", "sequential_layers"]
