"""Weights of a trained model's scale for the tiny models of `engine.py`."""


def initialize(model) -> int:
    """Give the model weights of a trained model's scale (vLLM's dummy weights are uniform in
    ±1e-3, which leaves every activation near 1e-6, far below any tolerance): norms 1, each
    matrix N(0, 1/fan_in), embeddings N(0, 1), biases N(0, 0.02^2). Seeded: the same model
    on every run. Runs inside each worker (`LLM.apply_model`)."""
    import torch

    g = torch.Generator().manual_seed(0)
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not torch.is_floating_point(p):
                continue
            if "norm" in name:
                w = torch.ones(p.shape)
            elif p.dim() >= 2:
                std = 1.0 if "embed" in name else p.shape[-1] ** -0.5
                w = torch.randn(p.shape, generator=g) * std
            else:
                w = torch.randn(p.shape, generator=g) * 0.02
            p.copy_(w.to(p.dtype))
            n += 1
    return n
